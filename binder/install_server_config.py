"""Merge binder/jupyter_server_config.json into the running Python environment's Jupyter server settings,
<sys.prefix>/etc/jupyter/jupyter_server_config.json (keeping any setting already there that the course does
not set). Run by binder/postBuild; on a TLJH run it with the users' Python (docs/hub.md).

A file in etc/jupyter/jupyter_server_config.d/ would NOT do: Jupyter Server reads only the server
extensions to enable from that folder, every other setting there is ignored.
"""

import json
import sys
from pathlib import Path

course = json.loads((Path(__file__).resolve().parent / "jupyter_server_config.json").read_text())
target = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.json"
target.parent.mkdir(parents=True, exist_ok=True)
settings = json.loads(target.read_text()) if target.exists() else {}
for section, values in course.items():
    settings.setdefault(section, {}).update(values)
target.write_text(json.dumps(settings, indent=2) + "\n")
print(f"course's Jupyter server settings written to {target}")
