"""helios.contract: the wire schema (generated `serving_pb2`, `manifest_pb2`) and
`PreparedContract`, the decoded and validated serving contract plus execution manifest.

    from helios.contract import PreparedContract, StartupOptions, resolve_settings
    prepared = PreparedContract.decode(contract_bytes, manifest_bytes)   # ContractError on defects
    settings = resolve_settings(prepared, StartupOptions(max_concurrency=8))
"""

from helios.contract.prepared import PreparedContract
from helios.contract.settings import (
    ResolvedSampling,
    ResolvedSettings,
    SamplingOptions,
    StartupOptionError,
    StartupOptions,
    resolve_settings,
)
from helios.contract.validate_model import EXPORTED_VERSION, SUPPORTED_VERSIONS
from helios.contract.views import AccessView, BindingView, BufferView, CapacityView, GraphView

__all__ = [
    "EXPORTED_VERSION",
    "SUPPORTED_VERSIONS",
    "AccessView",
    "BindingView",
    "BufferView",
    "CapacityView",
    "GraphView",
    "PreparedContract",
    "ResolvedSampling",
    "ResolvedSettings",
    "SamplingOptions",
    "StartupOptionError",
    "StartupOptions",
    "resolve_settings",
]
