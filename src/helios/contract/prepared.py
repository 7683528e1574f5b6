"""`PreparedContract`: the decoded, validated serving contract and execution manifest.

Construction always validates (`decode`, `from_json`, `from_messages`, `from_bundle`); an
instance therefore satisfies every rule in validate.py. It owns private copies of both
messages. `.contract` and `.manifest` expose them for reading only: mutating them is a bug
(encode() and the typed views were fixed at construction and would no longer agree).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Iterable, Mapping

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.contract.json_form import from_json, to_json
from helios.contract.rules import fail
from helios.contract.validate import validate
from helios.contract.validate_model import input_range
from helios.contract.settings import ResolvedSettings, resolve_settings
from helios.contract.views import BufferView, GraphView, buffer_view, graph_view


def _parse(cls: type[Message], data: bytes, path: str) -> Message:
    message = cls()
    try:
        message.ParseFromString(data)
    except Exception as error:  # protobuf raises DecodeError, ValueError or RuntimeWarning subclasses
        fail(path, f"not a valid {cls.DESCRIPTOR.name} encoding: {error}")
    return message


class PreparedContract:
    """An immutable, validated contract + manifest pair with typed read-only views."""

    __slots__ = ("_contract", "_manifest", "_encoded", "_graphs", "_buffers", "_destinations")

    def __init__(self, contract: spb.ServingContract, manifest: mpb.ExecutionManifest, encoded: tuple[bytes, bytes],
                 servable: bool = True):
        """Internal: use decode(), from_json(), from_messages() or from_bundle()."""
        index = validate(contract, manifest, servable=servable)
        destinations = {d.name: d.buffer for d in manifest.destinations}
        views = {v.name: v for v in contract.model.state_views}
        graphs = {g.name: graph_view(g, destinations, views) for g in contract.model.graphs}
        object.__setattr__(self, "_contract", contract)
        object.__setattr__(self, "_manifest", manifest)
        object.__setattr__(self, "_encoded", encoded)
        object.__setattr__(self, "_graphs", MappingProxyType(graphs))
        object.__setattr__(self, "_buffers", MappingProxyType({n: buffer_view(e.message) for n, e in index.buffers.items()}))
        object.__setattr__(self, "_destinations", MappingProxyType(destinations))

    def __setattr__(self, name, value):
        raise AttributeError("PreparedContract is immutable")

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def decode(cls, contract_bytes: bytes, manifest_bytes: bytes, *, servable: bool = True) -> "PreparedContract":
        """Decode and validate the wire encodings of a ServingContract and an ExecutionManifest
        (`servable=False`: the specification's rules only, see `validate`)."""
        contract = _parse(spb.ServingContract, bytes(contract_bytes), "contract")
        manifest = _parse(mpb.ExecutionManifest, bytes(manifest_bytes), "manifest")
        return cls(contract, manifest, (bytes(contract_bytes), bytes(manifest_bytes)), servable)

    @classmethod
    def from_messages(cls, contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> "PreparedContract":
        """Validate copies of two messages (the caller keeps ownership of its own)."""
        own_contract, own_manifest = spb.ServingContract(), mpb.ExecutionManifest()
        own_contract.CopyFrom(contract)
        own_manifest.CopyFrom(manifest)
        return cls(own_contract, own_manifest, _encode(own_contract, own_manifest))

    @classmethod
    def from_json(cls, text: str) -> "PreparedContract":
        """Parse and validate the semantic JSON form (see json_form.py)."""
        contract, manifest = from_json(text)
        return cls(contract, manifest, _encode(contract, manifest))

    @classmethod
    def from_bundle(cls, data: bytes) -> "PreparedContract":
        """Decode the binary file form: a PreparedContractBundle holding both encodings."""
        bundle = _parse(mpb.PreparedContractBundle, bytes(data), "bundle")
        # As the JSON form refuses a repeated key: protobuf keeps the last of a repeated field (two
        # bundles concatenated read as the second) and skips unknown ones (bytes appended to a
        # bundle), so both would pass unseen.
        unknown = UnknownFieldSet(bundle)
        if len(unknown):
            fail("bundle", f"unknown field number {unknown[0].field_number} (not in this schema)")
        if len(bundle.SerializeToString(deterministic=True)) != len(data):
            fail("bundle", "a field appears more than once (or is not minimally encoded)")
        return cls.decode(bundle.contract, bundle.manifest)

    # -- encodings ------------------------------------------------------------------------

    def encode(self) -> tuple[bytes, bytes]:
        """(contract bytes, manifest bytes): the decoded bytes, or deterministic encodings."""
        return self._encoded

    def to_bundle(self) -> bytes:
        contract, manifest = self._encoded
        return mpb.PreparedContractBundle(contract=contract, manifest=manifest).SerializeToString(deterministic=True)

    def to_json(self) -> str:
        return to_json(self._contract, self._manifest)

    # -- read-only access -----------------------------------------------------------------

    @property
    def contract(self) -> spb.ServingContract:
        """The ServingContract message. Read only."""
        return self._contract

    @property
    def manifest(self) -> mpb.ExecutionManifest:
        """The ExecutionManifest message. Read only."""
        return self._manifest

    @property
    def version(self) -> int:
        return self._contract.model.version

    @property
    def graphs(self) -> Mapping[str, GraphView]:
        """Graph views by name, in declaration order."""
        return self._graphs

    @property
    def buffers(self) -> Mapping[str, BufferView]:
        """Buffer views by name, in declaration order."""
        return self._buffers

    @property
    def destinations(self) -> Mapping[str, str]:
        """Transport destination name -> buffer name."""
        return self._destinations

    @property
    def input_range(self) -> tuple[int, int]:
        """Valid input ids [begin, end); version-1 contracts accept the sampled range."""
        return input_range(self._contract.model)

    @property
    def sampled_range(self) -> tuple[int, int]:
        sampled = self._contract.model.vocabulary.sampled
        return sampled.begin, sampled.end

    @property
    def logit_bias_width(self) -> int:
        """Logit-bias entries one request may hold: the narrowest ``logit_bias_ids`` /
        ``logit_bias_values`` input any graph binds (0: no graph takes a logit bias)."""
        return self._narrowest_row(spb.VALUE_SOURCE_LOGIT_BIAS_IDS, spb.VALUE_SOURCE_LOGIT_BIAS_VALUES)

    @property
    def eos_width(self) -> int:
        """EOS ids one request may hold where a graph matches them on the device: the narrowest EOS-ids
        input any graph binds (0: none does, the host matches EOS and takes any number)."""
        return self._narrowest_row(spb.VALUE_SOURCE_EOS_IDS)

    def _narrowest_row(self, *sources: int) -> int:
        """The fewest per-request entries among the inputs bound to `sources` (a buffer of one
        dimension holds one a request); 0 where none is bound."""
        widths = []
        for graph in self._graphs.values():
            for binding in graph.bindings:
                buffer = self._buffers.get(binding.buffer)
                if binding.source in sources and buffer is not None:
                    widths.append(buffer.shape[-1] if len(buffer.shape) > 1 else 1)
        return min((w for w in widths if isinstance(w, int)), default=0)

    def graphs_for(self, operation: int) -> tuple[GraphView, ...]:
        """Graphs performing `operation` (a GraphOperation number), in declaration order."""
        return tuple(g for g in self._graphs.values() if g.operation == operation)

    def state_rows_per_request(self, graph_names: Iterable[str] | None = None) -> int:
        """Rows one request occupies: the maximum over the selected graphs (default: all)."""
        names = self._graphs if graph_names is None else graph_names
        return max((self._graphs[name].state_rows_per_request for name in names), default=0)

    @property
    def defaults(self) -> ResolvedSettings:
        """Settings resolved from the core's defaults alone (no startup options)."""
        return resolve_settings(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, PreparedContract) and self._contract == other._contract and self._manifest == other._manifest

    __hash__ = None

    def __repr__(self) -> str:
        return (
            f"PreparedContract(served_id={self._contract.served_id!r}, version={self.version}, "
            f"graphs={len(self._graphs)}, buffers={len(self._buffers)})"
        )


def _encode(contract: spb.ServingContract, manifest: mpb.ExecutionManifest) -> tuple[bytes, bytes]:
    return contract.SerializeToString(deterministic=True), manifest.SerializeToString(deterministic=True)
