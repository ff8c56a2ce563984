"""What every service and tool of the project shares, at the bottom of the import order.

- `validation.py`: ValidationError and the field checks of every wire format (JSON bodies, records),
  `settings.py`: typed settings dataclasses read from dicts, once per process (types from the
  annotations, errors naming the dotted key);
- `fastjson.py`: JSON (orjson / simdjson when installed, the standard library otherwise);
  `http_json.py`: the Flask app with JSON errors and strict JSON replies, the network flags;
- `prometheus.py`: Prometheus text exposition; `stats.py`: the percentile of /stats and the benches;
- `cli.py`: the argparse style of every CLI; `shutdown.py`: signals and bind errors;
  `service.py`: start a service, wait for its health endpoint, stop it by PID;
- `fileio.py`: atomic file output; `urls.py`: server URL lists; `backoff.py`: retry delays.

May import: nothing of this project.
"""
