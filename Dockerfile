# Multi-stage: build the wheels of lowtide and lowtide-client (each owning its own files)
# and of their dependencies, install them on a slim base. Without the `embedded` extra: compose runs PostgreSQL.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY lowtide ./lowtide
COPY scheduler_service ./scheduler_service
COPY signal_service ./signal_service
COPY clients/python ./clients/python
RUN pip wheel --no-cache-dir --wheel-dir /wheels ./clients/python .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 lowtide
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER lowtide
# gRPC health checking through the CLI (grpc.health.v1), so no probe binary is needed. This
# checks the scheduler's port; compose gives the signal service its own check and turns it off
# for workers, which serve nothing.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["lowtide", "health", "--target", "127.0.0.1:50051"]
ENTRYPOINT ["lowtide"]
CMD ["--help"]
