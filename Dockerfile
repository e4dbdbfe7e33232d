# Multi-stage: build a wheel of lowtide (with lowtide_client inside), install it on a slim base.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY lowtide ./lowtide
COPY scheduler_service ./scheduler_service
COPY signal_service ./signal_service
COPY clients/python ./clients/python
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 lowtide
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER lowtide
ENTRYPOINT ["lowtide"]
CMD ["--help"]
