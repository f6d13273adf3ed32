# The pyscheduler image: the daemons and the migrate command.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY pyscheduler ./pyscheduler
COPY sql ./sql
COPY migrations ./migrations
RUN pip install --no-cache-dir . && useradd --system pyscheduler
USER pyscheduler
ENTRYPOINT ["pyscheduler"]
CMD ["run", "--no-migrate"]
