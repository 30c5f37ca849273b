FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir ".[worker,stats]"
CMD ["rlwatch", "worker"]
