# The sidecar image: runs `rlm serve` next to a broker. Mount the broker's log dirs (read-write: staging
# hard-links segments next to them), the config at /etc/rlm/sidecar.yaml, and a volume for /var/lib/rlm.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/rlm
# Only the packages pyproject.toml ships: devtools/ (the dev Kafka launcher), tests/ and bench/ stay out.
COPY pyproject.toml README.md ./
COPY rsm ./rsm
COPY rlmm ./rlmm
COPY rlm ./rlm
RUN pip install . \
 && useradd --system --uid 10001 --home-dir /var/lib/rlm --create-home rlm

# The broker usually runs as its own user; run the sidecar with a uid that may read and hard-link its files
# (e.g. `--user <kafka uid>` or a shared group), never as root.
USER rlm
VOLUME ["/var/lib/rlm"]
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
  CMD python -c "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9464/health', timeout=2).status == 200 else 1)"
ENTRYPOINT ["rlm"]
CMD ["serve", "--config", "/etc/rlm/sidecar.yaml"]
