"""kv-offload-prometheus: Prometheus metrics of kv-offload managers, as a hook plugin.

The module is the ``kv_offload.hooks`` entry point ``prometheus``. It follows kv-offload's
settings convention: :func:`parse_settings` checks a ``[hooks.prometheus]`` table and
:func:`create_plugin` builds the :class:`PrometheusExporter` that is registered, one per
plugin manager. Installed, it loads like any hook plugin; without a ``port`` it serves nothing
and its metrics wait in ``exporter.registry``::

    pm = manager.plugin_manager
    exporter = pm.get_plugin("prometheus")
    prometheus_client.generate_latest(exporter.registry)
"""

from __future__ import annotations

from .exporter import PrometheusExporter
from .settings import DEFAULT_BUCKETS, Settings, parse_settings

__all__ = ["DEFAULT_BUCKETS", "PrometheusExporter", "Settings", "create_plugin", "parse_settings"]


def create_plugin(settings: Settings) -> PrometheusExporter:
    """The exporter to register (starts the HTTP server when ``settings.port`` is set)."""
    return PrometheusExporter(settings)
