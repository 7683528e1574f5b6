from helios.contract import manifest_pb2 as _manifest_pb2
from helios.contract import serving_pb2 as _serving_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SignatureAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SIGNATURE_ALGORITHM_UNSPECIFIED: _ClassVar[SignatureAlgorithm]
    SIGNATURE_ALGORITHM_ED25519: _ClassVar[SignatureAlgorithm]

class ResourceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOURCE_KIND_UNSPECIFIED: _ClassVar[ResourceKind]
    RESOURCE_KIND_PROGRAM: _ClassVar[ResourceKind]
    RESOURCE_KIND_WEIGHTS: _ClassVar[ResourceKind]
    RESOURCE_KIND_TOKENIZER: _ClassVar[ResourceKind]
    RESOURCE_KIND_CHAT_TEMPLATE: _ClassVar[ResourceKind]
    RESOURCE_KIND_TUNING_PROGRAM: _ClassVar[ResourceKind]
    RESOURCE_KIND_PROGRAM_IMAGE: _ClassVar[ResourceKind]
SIGNATURE_ALGORITHM_UNSPECIFIED: SignatureAlgorithm
SIGNATURE_ALGORITHM_ED25519: SignatureAlgorithm
RESOURCE_KIND_UNSPECIFIED: ResourceKind
RESOURCE_KIND_PROGRAM: ResourceKind
RESOURCE_KIND_WEIGHTS: ResourceKind
RESOURCE_KIND_TOKENIZER: ResourceKind
RESOURCE_KIND_CHAT_TEMPLATE: ResourceKind
RESOURCE_KIND_TUNING_PROGRAM: ResourceKind
RESOURCE_KIND_PROGRAM_IMAGE: ResourceKind

class CoreBody(_message.Message):
    __slots__ = ("format_version", "envelope", "locations")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    envelope: SignedEnvelope
    locations: LocationSet
    def __init__(self, format_version: _Optional[int] = ..., envelope: _Optional[_Union[SignedEnvelope, _Mapping]] = ..., locations: _Optional[_Union[LocationSet, _Mapping]] = ...) -> None: ...

class SignedEnvelope(_message.Message):
    __slots__ = ("payload", "signatures")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    SIGNATURES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    signatures: _containers.RepeatedCompositeFieldContainer[Signature]
    def __init__(self, payload: _Optional[bytes] = ..., signatures: _Optional[_Iterable[_Union[Signature, _Mapping]]] = ...) -> None: ...

class Signature(_message.Message):
    __slots__ = ("algorithm", "key_id", "public_key", "signature")
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    algorithm: SignatureAlgorithm
    key_id: bytes
    public_key: bytes
    signature: bytes
    def __init__(self, algorithm: _Optional[_Union[SignatureAlgorithm, str]] = ..., key_id: _Optional[bytes] = ..., public_key: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class LocationSet(_message.Message):
    __slots__ = ("locations",)
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    locations: _containers.RepeatedCompositeFieldContainer[ResourceLocation]
    def __init__(self, locations: _Optional[_Iterable[_Union[ResourceLocation, _Mapping]]] = ...) -> None: ...

class ResourceLocation(_message.Message):
    __slots__ = ("resource_id", "file", "offset")
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    resource_id: str
    file: str
    offset: int
    def __init__(self, resource_id: _Optional[str] = ..., file: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class PublisherTerms(_message.Message):
    __slots__ = ("namespace", "license", "acceptance_terms")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LICENSE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_TERMS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    license: str
    acceptance_terms: str
    def __init__(self, namespace: _Optional[str] = ..., license: _Optional[str] = ..., acceptance_terms: _Optional[str] = ...) -> None: ...

class ProgramImage(_message.Message):
    __slots__ = ("version", "exported_program", "state_dict", "constants")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPORTED_PROGRAM_FIELD_NUMBER: _ClassVar[int]
    STATE_DICT_FIELD_NUMBER: _ClassVar[int]
    CONSTANTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    exported_program: bytes
    state_dict: bytes
    constants: bytes
    def __init__(self, version: _Optional[int] = ..., exported_program: _Optional[bytes] = ..., state_dict: _Optional[bytes] = ..., constants: _Optional[bytes] = ...) -> None: ...

class ExecutableResource(_message.Message):
    __slots__ = ("id", "kind", "rank", "stored_nbytes", "decoded_nbytes", "chunk_nbytes", "chunk_sha256")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STORED_NBYTES_FIELD_NUMBER: _ClassVar[int]
    DECODED_NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SHA256_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: ResourceKind
    rank: int
    stored_nbytes: int
    decoded_nbytes: int
    chunk_nbytes: int
    chunk_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[ResourceKind, str]] = ..., rank: _Optional[int] = ..., stored_nbytes: _Optional[int] = ..., decoded_nbytes: _Optional[int] = ..., chunk_nbytes: _Optional[int] = ..., chunk_sha256: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeploymentBody(_message.Message):
    __slots__ = ("contract", "manifest", "publisher", "resources", "rebuild", "weight_catalogs")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    REBUILD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_CATALOGS_FIELD_NUMBER: _ClassVar[int]
    contract: _serving_pb2.ServingContract
    manifest: _manifest_pb2.ExecutionManifest
    publisher: PublisherTerms
    resources: _containers.RepeatedCompositeFieldContainer[ExecutableResource]
    rebuild: RebuildManifest
    weight_catalogs: _containers.RepeatedCompositeFieldContainer[WeightCatalog]
    def __init__(self, contract: _Optional[_Union[_serving_pb2.ServingContract, _Mapping]] = ..., manifest: _Optional[_Union[_manifest_pb2.ExecutionManifest, _Mapping]] = ..., publisher: _Optional[_Union[PublisherTerms, _Mapping]] = ..., resources: _Optional[_Iterable[_Union[ExecutableResource, _Mapping]]] = ..., rebuild: _Optional[_Union[RebuildManifest, _Mapping]] = ..., weight_catalogs: _Optional[_Iterable[_Union[WeightCatalog, _Mapping]]] = ...) -> None: ...

class RebuildManifest(_message.Message):
    __slots__ = ("version", "recipe", "preparer", "inputs")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    PREPARER_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    version: int
    recipe: str
    preparer: str
    inputs: _containers.RepeatedCompositeFieldContainer[RebuildInput]
    def __init__(self, version: _Optional[int] = ..., recipe: _Optional[str] = ..., preparer: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[RebuildInput, _Mapping]]] = ...) -> None: ...

class RebuildInput(_message.Message):
    __slots__ = ("path", "nbytes", "sha256")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    path: str
    nbytes: int
    sha256: bytes
    def __init__(self, path: _Optional[str] = ..., nbytes: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class WeightCatalog(_message.Message):
    __slots__ = ("version", "rank", "resource_id", "tensors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    version: int
    rank: int
    resource_id: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorView]
    def __init__(self, version: _Optional[int] = ..., rank: _Optional[int] = ..., resource_id: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorView, _Mapping]]] = ...) -> None: ...

class TensorView(_message.Message):
    __slots__ = ("name", "dtype", "shape", "byte_offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BYTE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: _manifest_pb2.Dtype
    shape: _containers.RepeatedScalarFieldContainer[int]
    byte_offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[_manifest_pb2.Dtype, str]] = ..., shape: _Optional[_Iterable[int]] = ..., byte_offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class ModelIndex(_message.Message):
    __slots__ = ("contract", "manifest", "publisher", "index", "rebuild", "weight_catalogs")
    CONTRACT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REBUILD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_CATALOGS_FIELD_NUMBER: _ClassVar[int]
    contract: _serving_pb2.ServingContract
    manifest: _manifest_pb2.ExecutionManifest
    publisher: PublisherTerms
    index: ProtectedIndex
    rebuild: RebuildManifest
    weight_catalogs: _containers.RepeatedCompositeFieldContainer[WeightCatalog]
    def __init__(self, contract: _Optional[_Union[_serving_pb2.ServingContract, _Mapping]] = ..., manifest: _Optional[_Union[_manifest_pb2.ExecutionManifest, _Mapping]] = ..., publisher: _Optional[_Union[PublisherTerms, _Mapping]] = ..., index: _Optional[_Union[ProtectedIndex, _Mapping]] = ..., rebuild: _Optional[_Union[RebuildManifest, _Mapping]] = ..., weight_catalogs: _Optional[_Iterable[_Union[WeightCatalog, _Mapping]]] = ...) -> None: ...

class ProtectedIndex(_message.Message):
    __slots__ = ("version", "resources")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    version: int
    resources: _containers.RepeatedCompositeFieldContainer[LogicalResource]
    def __init__(self, version: _Optional[int] = ..., resources: _Optional[_Iterable[_Union[LogicalResource, _Mapping]]] = ...) -> None: ...

class LogicalResource(_message.Message):
    __slots__ = ("id", "kind", "rank", "stored_nbytes", "decoded_nbytes", "chunk_nbytes", "chunk_sha256", "nonce_prefix")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STORED_NBYTES_FIELD_NUMBER: _ClassVar[int]
    DECODED_NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_NBYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SHA256_FIELD_NUMBER: _ClassVar[int]
    NONCE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: ResourceKind
    rank: int
    stored_nbytes: int
    decoded_nbytes: int
    chunk_nbytes: int
    chunk_sha256: _containers.RepeatedScalarFieldContainer[bytes]
    nonce_prefix: bytes
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[ResourceKind, str]] = ..., rank: _Optional[int] = ..., stored_nbytes: _Optional[int] = ..., decoded_nbytes: _Optional[int] = ..., chunk_nbytes: _Optional[int] = ..., chunk_sha256: _Optional[_Iterable[bytes]] = ..., nonce_prefix: _Optional[bytes] = ...) -> None: ...
