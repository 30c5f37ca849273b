# rlwatch: the worker (Kafka + Redis) with its dashboard, as docker-compose.yml runs it.
# The build context is filtered by .dockerignore (no .git, no Kafka jars under .local, no tests).
FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /home/rlwatch --create-home rlwatch
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir ".[worker,web]"
# Faust keeps its local table data under the working directory: the user's home
WORKDIR /home/rlwatch
USER rlwatch
EXPOSE 8765
CMD ["rlwatch", "worker", "--web", "0.0.0.0:8765"]
