"""The edges of a deployment: the adapters that move records between the outside world and
a pipeline's topics (a file, standard input, HTTP), each a process of its own with its own
position, so that a restart or a takeover neither skips nor repeats a record."""
