# The image of docker-compose.yaml (twinstream/airflow:dev), run by the Airflow services and by
# the two engines: the official Airflow image plus a Java runtime for Spark, Spark's Kafka
# connector jars, the exact pins of requirements.txt/constraints.txt and the twinstream package.
# docker-compose.yaml mounts the repo's dags/, plugins/, include/ and spark_jobs/ on top, so
# code changes need no rebuild; dependency changes (Python or java/*.xml) do.

# ---------------------------------------------------------------------------------------------
# Stage 1: the jars, fetched from Maven Central by the same command as `make install`
# (java/pom.xml; java/settings.xml routes every repository to Central). Writes /jars/kafka,
# /jars/zookeeper, /jars/spark-kafka, and the benchmarks' baselines /jars/kafka-streams and
# /jars/flink; only spark-kafka is needed at runtime (the brokers and ZooKeeper run from their
# own images).
# ---------------------------------------------------------------------------------------------
FROM maven:3.9-eclipse-temurin-17 AS jars
WORKDIR /build
COPY java/ ./java/
RUN set -eux; \
    mvn -B -s java/settings.xml -f java/pom.xml package -Dtwinstream.jars=/jars; \
    # twinstream.engine.spark.kafka_jars refuses a folder without the connector: fail here instead.
    ls /jars/spark-kafka/spark-sql-kafka-*.jar

# ---------------------------------------------------------------------------------------------
# Stage 2: the image itself.
# ---------------------------------------------------------------------------------------------
FROM apache/airflow:3.3.2-python3.11

# Spark (spark-submit, local[N]) needs a JVM. Java 17, as on the Docker-free stack; override
# with --build-arg JAVA_PACKAGE=openjdk-21-jre-headless on a base without Java 17.
ARG JAVA_PACKAGE=openjdk-17-jre-headless

USER root
RUN set -eux; \
    # Debian slim images drop man pages; the JRE's postinst still wants this folder.
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends "${JAVA_PACKAGE}"; \
    apt-get autoremove -yqq --purge; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*; \
    # An architecture-independent JAVA_HOME (java-17-openjdk-amd64, -arm64, ...).
    ln -sfn "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/twinstream-java; \
    /usr/lib/jvm/twinstream-java/bin/java -version; \
    # Engine state and the snapshots volume: the named volume copies this folder's owner, so
    # the airflow user (uid 50000, gid 0) can write there.
    mkdir -p /opt/twinstream/state /opt/twinstream/snapshots /opt/twinstream/src \
      /opt/twinstream/state/tls /opt/twinstream/kafka-ca /opt/twinstream/kafka-credentials; \
    chown -R airflow:0 /opt/twinstream; \
    chmod -R g+rwX /opt/twinstream
ENV JAVA_HOME=/usr/lib/jvm/twinstream-java

USER airflow
WORKDIR /opt/twinstream/src

# Dependencies first, so that a code change does not reinstall them. requirements.txt pins
# apache-airflow to this image's own version (3.3.2); a mismatch would fail the resolver here.
COPY --chown=airflow:0 requirements.txt constraints.txt pyproject.toml ./
RUN set -eux; \
    pip install --no-cache-dir -r requirements.txt -c constraints.txt; \
    # apache-airflow-providers-apache-spark pulls pyspark-client, which overwrites pyspark's
    # Python files with an older version: put pyspark's own back (same step as the Makefile).
    pyspark_pin="$(sed -n 's/^pyspark==//p' requirements.txt)"; \
    test -n "${pyspark_pin}"; \
    pip install --no-cache-dir --force-reinstall --no-deps "pyspark==${pyspark_pin}"; \
    python -c "import pyspark, sys; v = pyspark.__version__; sys.exit(0 if v == '${pyspark_pin}' else f'pyspark is {v}, want ${pyspark_pin}')"

# Spark's Kafka connector and what it adds to pyspark (twinstream.engine.spark.kafka_jars reads
# <TWINSTREAM_JARS_DIR>/spark-kafka/*.jar). Read-only for the airflow user, on purpose.
COPY --from=jars /jars/spark-kafka /opt/twinstream/jars/spark-kafka
ENV TWINSTREAM_JARS_DIR=/opt/twinstream/jars

# The package itself (include/twinstream), installed for entry points and for use without the
# bind mounts. With the mounts, PYTHONPATH=/opt/airflow/include takes precedence over it.
COPY --chown=airflow:0 include/ ./include/
RUN pip install --no-cache-dir --no-deps . \
    && python -c "import twinstream"

WORKDIR /opt/airflow
