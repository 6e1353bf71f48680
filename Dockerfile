FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY store store
COPY harvest harvest
COPY workers workers
COPY beat_schedule.py ./
RUN pip install --no-cache-dir -c constraints.txt .
ENV LITELLM_LOCAL_MODEL_COST_MAP=True
CMD ["gleaner", "--help"]
