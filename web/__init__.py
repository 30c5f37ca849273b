"""The rlwatch dashboard: fleet page, per-run cockpit, live updates, controls, /metrics.

* :mod:`web.fleet`: the pure model (runs, bounded history, alerts, rows);
* :mod:`web.series`, :mod:`web.dists`: spike-preserving downsampling, distributions over time;
* :mod:`web.metrics`: the Prometheus export;
* :mod:`web.server`: the aiohttp app and the background-thread runner used by
  ``rlwatch demo --web`` and ``rlwatch worker --web``;
* ``static/``: the pages, their JavaScript, and the built uPlot (copied by ``frontend/``).
"""

from web.fleet import Fleet, kl_lines_from_pack

__all__ = ["Fleet", "kl_lines_from_pack"]
