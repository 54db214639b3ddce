"""Fakes shared by unit tests."""


class FakeClock:
    """A monotonic clock that only moves when a test or the code under test sleeps: call
    it, or use it as a `time` module (`monotonic`, `sleep`)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
