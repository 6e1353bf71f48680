FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True

WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY privacy privacy
COPY store store
COPY harvest harvest
COPY workers workers
COPY gleaner gleaner
COPY service service
COPY cli cli
COPY gleaner/beat_schedule.py ./
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/gleaner gleaner \
    && mkdir /exports

# Never root: a numeric user, so orchestrators can check runAsNonRoot. Its home is the
# working directory (writable: beat's schedule file, a SQLite database if one is used).
USER 10001:10001
WORKDIR /home/gleaner
CMD ["gleaner", "--help"]
