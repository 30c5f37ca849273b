# rlwatch: the worker (Kafka + Redis) with its dashboard, as docker-compose.yml runs it.
# The build context is filtered by .dockerignore (no .git, no Kafka jars under .local, no tests).
#
# Stage 1 builds the wheels, the native core (native/, Rust) among them, with a Rust toolchain
# that stays out of the final image.
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* \
 && curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
ENV PATH=/root/.cargo/bin:$PATH
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[worker,web]"

# Stage 2: the worker, from those wheels only.
FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /home/rlwatch --create-home rlwatch
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "rlwatch[worker,web]" && rm -rf /wheels \
 && rlwatch --version | grep -q "native core"
# Faust keeps its local table data under the working directory: the user's home
WORKDIR /home/rlwatch
USER rlwatch
EXPOSE 8765
CMD ["rlwatch", "worker", "--web", "0.0.0.0:8765"]
