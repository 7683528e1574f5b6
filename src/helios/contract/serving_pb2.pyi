from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SeedPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEED_POLICY_UNSPECIFIED: _ClassVar[SeedPolicy]
    SEED_POLICY_RANDOM: _ClassVar[SeedPolicy]
    SEED_POLICY_FIXED: _ClassVar[SeedPolicy]

class HistoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HISTORY_KIND_UNSPECIFIED: _ClassVar[HistoryKind]
    HISTORY_KIND_PAGED_KEY_VALUE: _ClassVar[HistoryKind]
    HISTORY_KIND_PAGED_LATENT: _ClassVar[HistoryKind]
    HISTORY_KIND_SLIDING_WINDOW: _ClassVar[HistoryKind]
    HISTORY_KIND_RECURRENT: _ClassVar[HistoryKind]
    HISTORY_KIND_CONTINUATION: _ClassVar[HistoryKind]

class GraphOperation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRAPH_OPERATION_UNSPECIFIED: _ClassVar[GraphOperation]
    GRAPH_OPERATION_INITIALIZATION: _ClassVar[GraphOperation]
    GRAPH_OPERATION_RESTORATION: _ClassVar[GraphOperation]
    GRAPH_OPERATION_PREFILL: _ClassVar[GraphOperation]
    GRAPH_OPERATION_SCORED_PREFILL: _ClassVar[GraphOperation]
    GRAPH_OPERATION_RESUME: _ClassVar[GraphOperation]
    GRAPH_OPERATION_DECODE: _ClassVar[GraphOperation]
    GRAPH_OPERATION_SPECULATIVE: _ClassVar[GraphOperation]
    GRAPH_OPERATION_MIXED: _ClassVar[GraphOperation]
    GRAPH_OPERATION_SNAPSHOT: _ClassVar[GraphOperation]
    GRAPH_OPERATION_TUNING: _ClassVar[GraphOperation]
    GRAPH_OPERATION_VISION: _ClassVar[GraphOperation]

class ValueSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VALUE_SOURCE_UNSPECIFIED: _ClassVar[ValueSource]
    VALUE_SOURCE_SLOT: _ClassVar[ValueSource]
    VALUE_SOURCE_GENERATION: _ClassVar[ValueSource]
    VALUE_SOURCE_LIVE_ROW_COUNT: _ClassVar[ValueSource]
    VALUE_SOURCE_QUERY_LENGTH: _ClassVar[ValueSource]
    VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: _ClassVar[ValueSource]
    VALUE_SOURCE_SAMPLING_DECISION: _ClassVar[ValueSource]
    VALUE_SOURCE_MIXED_PREFILL_ROW: _ClassVar[ValueSource]
    VALUE_SOURCE_PROMPT_TOKENS: _ClassVar[ValueSource]
    VALUE_SOURCE_SCORED_TARGET_TOKENS: _ClassVar[ValueSource]
    VALUE_SOURCE_PENDING_TOKEN: _ClassVar[ValueSource]
    VALUE_SOURCE_PROMPT_POSITIONS: _ClassVar[ValueSource]
    VALUE_SOURCE_IMAGE_FEATURE_INDICES: _ClassVar[ValueSource]
    VALUE_SOURCE_IMAGE_CONTEXT_INDICES: _ClassVar[ValueSource]
    VALUE_SOURCE_IMAGE_FEATURE_SLOT: _ClassVar[ValueSource]
    VALUE_SOURCE_PAGE_TABLE: _ClassVar[ValueSource]
    VALUE_SOURCE_LIVE_STATE_ROWS: _ClassVar[ValueSource]
    VALUE_SOURCE_RESTORE_SOURCE: _ClassVar[ValueSource]
    VALUE_SOURCE_SNAPSHOT_DESTINATION: _ClassVar[ValueSource]
    VALUE_SOURCE_CONSUMED_TOKEN_START: _ClassVar[ValueSource]
    VALUE_SOURCE_CONSUMED_TOKEN_END: _ClassVar[ValueSource]
    VALUE_SOURCE_SEED_BITS: _ClassVar[ValueSource]
    VALUE_SOURCE_SAMPLING_PARAMETERS: _ClassVar[ValueSource]
    VALUE_SOURCE_OUTPUT_LIMIT: _ClassVar[ValueSource]
    VALUE_SOURCE_EOS_IDS: _ClassVar[ValueSource]
    VALUE_SOURCE_PROMPT_HISTOGRAM: _ClassVar[ValueSource]
    VALUE_SOURCE_GRAMMAR_MASK: _ClassVar[ValueSource]
    VALUE_SOURCE_COPIED_CANDIDATE_IDS: _ClassVar[ValueSource]
    VALUE_SOURCE_COPIED_CANDIDATE_COUNT: _ClassVar[ValueSource]
    VALUE_SOURCE_COPIED_GENERATION: _ClassVar[ValueSource]
    VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT: _ClassVar[ValueSource]
    VALUE_SOURCE_COPIED_GRAMMAR_MASKS: _ClassVar[ValueSource]
    VALUE_SOURCE_CONSTANT: _ClassVar[ValueSource]
    VALUE_SOURCE_INACTIVE_PADDING: _ClassVar[ValueSource]
    VALUE_SOURCE_IMAGE_TENSOR: _ClassVar[ValueSource]
    VALUE_SOURCE_LOGIT_BIAS_IDS: _ClassVar[ValueSource]
    VALUE_SOURCE_LOGIT_BIAS_VALUES: _ClassVar[ValueSource]
    VALUE_SOURCE_HOST_TABLE_ROWS: _ClassVar[ValueSource]

class Indexing(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INDEXING_UNSPECIFIED: _ClassVar[Indexing]
    INDEXING_SCALAR: _ClassVar[Indexing]
    INDEXING_SUBMISSION_ROW: _ClassVar[Indexing]
    INDEXING_ACTIVE_ROW: _ClassVar[Indexing]
    INDEXING_PHYSICAL_REQUEST_ROW: _ClassVar[Indexing]
    INDEXING_PACKED_TOKEN: _ClassVar[Indexing]

class AccessMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACCESS_MODE_UNSPECIFIED: _ClassVar[AccessMode]
    ACCESS_MODE_READ: _ClassVar[AccessMode]
    ACCESS_MODE_WRITE: _ClassVar[AccessMode]
    ACCESS_MODE_READ_WRITE: _ClassVar[AccessMode]

class ToolParser(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_PARSER_UNSPECIFIED: _ClassVar[ToolParser]
    TOOL_PARSER_NONE: _ClassVar[ToolParser]
    TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS: _ClassVar[ToolParser]
    TOOL_PARSER_GLM_ARGUMENT_TAGS: _ClassVar[ToolParser]
    TOOL_PARSER_DSML: _ClassVar[ToolParser]
    TOOL_PARSER_XTML: _ClassVar[ToolParser]
    TOOL_PARSER_ATEM_RECIPIENT: _ClassVar[ToolParser]
    TOOL_PARSER_JSON_CALLS: _ClassVar[ToolParser]
    TOOL_PARSER_HARMONY_CHANNELS: _ClassVar[ToolParser]

class ReasoningParser(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASONING_PARSER_UNSPECIFIED: _ClassVar[ReasoningParser]
    REASONING_PARSER_NONE: _ClassVar[ReasoningParser]
    REASONING_PARSER_THINK_TAGS: _ClassVar[ReasoningParser]
    REASONING_PARSER_XTML_THINK: _ClassVar[ReasoningParser]
    REASONING_PARSER_RECIPIENT_HEADER: _ClassVar[ReasoningParser]
    REASONING_PARSER_HARMONY_CHANNELS: _ClassVar[ReasoningParser]

class ImagePreparation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_PREPARATION_UNSPECIFIED: _ClassVar[ImagePreparation]
    IMAGE_PREPARATION_NONE: _ClassVar[ImagePreparation]
    IMAGE_PREPARATION_RESIZE_NORMALIZE_PATCHES: _ClassVar[ImagePreparation]
    IMAGE_PREPARATION_TILE_GRID: _ClassVar[ImagePreparation]

class ImageLayout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMAGE_LAYOUT_UNSPECIFIED: _ClassVar[ImageLayout]
    IMAGE_LAYOUT_NONE: _ClassVar[ImageLayout]
    IMAGE_LAYOUT_FEATURE_SPAN: _ClassVar[ImageLayout]
    IMAGE_LAYOUT_ROW_SEPARATED_GRID: _ClassVar[ImageLayout]
    IMAGE_LAYOUT_SPATIAL_POSITIONS_3D: _ClassVar[ImageLayout]

class MessageRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_ROLE_UNSPECIFIED: _ClassVar[MessageRole]
    MESSAGE_ROLE_SYSTEM: _ClassVar[MessageRole]
    MESSAGE_ROLE_DEVELOPER: _ClassVar[MessageRole]
    MESSAGE_ROLE_USER: _ClassVar[MessageRole]
    MESSAGE_ROLE_ASSISTANT: _ClassVar[MessageRole]
    MESSAGE_ROLE_TOOL: _ClassVar[MessageRole]

class PrefixConstraint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFIX_CONSTRAINT_UNSPECIFIED: _ClassVar[PrefixConstraint]
    PREFIX_CONSTRAINT_STABLE: _ClassVar[PrefixConstraint]
    PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN: _ClassVar[PrefixConstraint]
    PREFIX_CONSTRAINT_CHANGES_WHEN_LAST: _ClassVar[PrefixConstraint]
SEED_POLICY_UNSPECIFIED: SeedPolicy
SEED_POLICY_RANDOM: SeedPolicy
SEED_POLICY_FIXED: SeedPolicy
HISTORY_KIND_UNSPECIFIED: HistoryKind
HISTORY_KIND_PAGED_KEY_VALUE: HistoryKind
HISTORY_KIND_PAGED_LATENT: HistoryKind
HISTORY_KIND_SLIDING_WINDOW: HistoryKind
HISTORY_KIND_RECURRENT: HistoryKind
HISTORY_KIND_CONTINUATION: HistoryKind
GRAPH_OPERATION_UNSPECIFIED: GraphOperation
GRAPH_OPERATION_INITIALIZATION: GraphOperation
GRAPH_OPERATION_RESTORATION: GraphOperation
GRAPH_OPERATION_PREFILL: GraphOperation
GRAPH_OPERATION_SCORED_PREFILL: GraphOperation
GRAPH_OPERATION_RESUME: GraphOperation
GRAPH_OPERATION_DECODE: GraphOperation
GRAPH_OPERATION_SPECULATIVE: GraphOperation
GRAPH_OPERATION_MIXED: GraphOperation
GRAPH_OPERATION_SNAPSHOT: GraphOperation
GRAPH_OPERATION_TUNING: GraphOperation
GRAPH_OPERATION_VISION: GraphOperation
VALUE_SOURCE_UNSPECIFIED: ValueSource
VALUE_SOURCE_SLOT: ValueSource
VALUE_SOURCE_GENERATION: ValueSource
VALUE_SOURCE_LIVE_ROW_COUNT: ValueSource
VALUE_SOURCE_QUERY_LENGTH: ValueSource
VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: ValueSource
VALUE_SOURCE_SAMPLING_DECISION: ValueSource
VALUE_SOURCE_MIXED_PREFILL_ROW: ValueSource
VALUE_SOURCE_PROMPT_TOKENS: ValueSource
VALUE_SOURCE_SCORED_TARGET_TOKENS: ValueSource
VALUE_SOURCE_PENDING_TOKEN: ValueSource
VALUE_SOURCE_PROMPT_POSITIONS: ValueSource
VALUE_SOURCE_IMAGE_FEATURE_INDICES: ValueSource
VALUE_SOURCE_IMAGE_CONTEXT_INDICES: ValueSource
VALUE_SOURCE_IMAGE_FEATURE_SLOT: ValueSource
VALUE_SOURCE_PAGE_TABLE: ValueSource
VALUE_SOURCE_LIVE_STATE_ROWS: ValueSource
VALUE_SOURCE_RESTORE_SOURCE: ValueSource
VALUE_SOURCE_SNAPSHOT_DESTINATION: ValueSource
VALUE_SOURCE_CONSUMED_TOKEN_START: ValueSource
VALUE_SOURCE_CONSUMED_TOKEN_END: ValueSource
VALUE_SOURCE_SEED_BITS: ValueSource
VALUE_SOURCE_SAMPLING_PARAMETERS: ValueSource
VALUE_SOURCE_OUTPUT_LIMIT: ValueSource
VALUE_SOURCE_EOS_IDS: ValueSource
VALUE_SOURCE_PROMPT_HISTOGRAM: ValueSource
VALUE_SOURCE_GRAMMAR_MASK: ValueSource
VALUE_SOURCE_COPIED_CANDIDATE_IDS: ValueSource
VALUE_SOURCE_COPIED_CANDIDATE_COUNT: ValueSource
VALUE_SOURCE_COPIED_GENERATION: ValueSource
VALUE_SOURCE_COPIED_CONSUMED_ENDPOINT: ValueSource
VALUE_SOURCE_COPIED_GRAMMAR_MASKS: ValueSource
VALUE_SOURCE_CONSTANT: ValueSource
VALUE_SOURCE_INACTIVE_PADDING: ValueSource
VALUE_SOURCE_IMAGE_TENSOR: ValueSource
VALUE_SOURCE_LOGIT_BIAS_IDS: ValueSource
VALUE_SOURCE_LOGIT_BIAS_VALUES: ValueSource
VALUE_SOURCE_HOST_TABLE_ROWS: ValueSource
INDEXING_UNSPECIFIED: Indexing
INDEXING_SCALAR: Indexing
INDEXING_SUBMISSION_ROW: Indexing
INDEXING_ACTIVE_ROW: Indexing
INDEXING_PHYSICAL_REQUEST_ROW: Indexing
INDEXING_PACKED_TOKEN: Indexing
ACCESS_MODE_UNSPECIFIED: AccessMode
ACCESS_MODE_READ: AccessMode
ACCESS_MODE_WRITE: AccessMode
ACCESS_MODE_READ_WRITE: AccessMode
TOOL_PARSER_UNSPECIFIED: ToolParser
TOOL_PARSER_NONE: ToolParser
TOOL_PARSER_QWEN_CODER_FUNCTION_TAGS: ToolParser
TOOL_PARSER_GLM_ARGUMENT_TAGS: ToolParser
TOOL_PARSER_DSML: ToolParser
TOOL_PARSER_XTML: ToolParser
TOOL_PARSER_ATEM_RECIPIENT: ToolParser
TOOL_PARSER_JSON_CALLS: ToolParser
TOOL_PARSER_HARMONY_CHANNELS: ToolParser
REASONING_PARSER_UNSPECIFIED: ReasoningParser
REASONING_PARSER_NONE: ReasoningParser
REASONING_PARSER_THINK_TAGS: ReasoningParser
REASONING_PARSER_XTML_THINK: ReasoningParser
REASONING_PARSER_RECIPIENT_HEADER: ReasoningParser
REASONING_PARSER_HARMONY_CHANNELS: ReasoningParser
IMAGE_PREPARATION_UNSPECIFIED: ImagePreparation
IMAGE_PREPARATION_NONE: ImagePreparation
IMAGE_PREPARATION_RESIZE_NORMALIZE_PATCHES: ImagePreparation
IMAGE_PREPARATION_TILE_GRID: ImagePreparation
IMAGE_LAYOUT_UNSPECIFIED: ImageLayout
IMAGE_LAYOUT_NONE: ImageLayout
IMAGE_LAYOUT_FEATURE_SPAN: ImageLayout
IMAGE_LAYOUT_ROW_SEPARATED_GRID: ImageLayout
IMAGE_LAYOUT_SPATIAL_POSITIONS_3D: ImageLayout
MESSAGE_ROLE_UNSPECIFIED: MessageRole
MESSAGE_ROLE_SYSTEM: MessageRole
MESSAGE_ROLE_DEVELOPER: MessageRole
MESSAGE_ROLE_USER: MessageRole
MESSAGE_ROLE_ASSISTANT: MessageRole
MESSAGE_ROLE_TOOL: MessageRole
PREFIX_CONSTRAINT_UNSPECIFIED: PrefixConstraint
PREFIX_CONSTRAINT_STABLE: PrefixConstraint
PREFIX_CONSTRAINT_CHANGES_AFTER_USER_TURN: PrefixConstraint
PREFIX_CONSTRAINT_CHANGES_WHEN_LAST: PrefixConstraint

class ServingContract(_message.Message):
    __slots__ = ("served_id", "aliases", "cache_identity", "context_tokens", "prefill_tokens", "page_capacity", "snapshot_capacity", "max_concurrency", "speculative_widths", "defaults", "model")
    SERVED_ID_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    CACHE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_WIDTHS_FIELD_NUMBER: _ClassVar[int]
    DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    served_id: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    cache_identity: str
    context_tokens: int
    prefill_tokens: int
    page_capacity: int
    snapshot_capacity: int
    max_concurrency: int
    speculative_widths: _containers.RepeatedScalarFieldContainer[int]
    defaults: ServingDefaults
    model: ModelContract
    def __init__(self, served_id: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., cache_identity: _Optional[str] = ..., context_tokens: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., page_capacity: _Optional[int] = ..., snapshot_capacity: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., speculative_widths: _Optional[_Iterable[int]] = ..., defaults: _Optional[_Union[ServingDefaults, _Mapping]] = ..., model: _Optional[_Union[ModelContract, _Mapping]] = ...) -> None: ...

class SamplingDefaults(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "max_output_tokens", "seed_policy", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEED_POLICY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    max_output_tokens: int
    seed_policy: SeedPolicy
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., max_output_tokens: _Optional[int] = ..., seed_policy: _Optional[_Union[SeedPolicy, str]] = ..., seed: _Optional[int] = ...) -> None: ...

class TemplateToken(_message.Message):
    __slots__ = ("name", "text", "token_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    text: str
    token_id: int
    def __init__(self, name: _Optional[str] = ..., text: _Optional[str] = ..., token_id: _Optional[int] = ...) -> None: ...

class ServingDefaults(_message.Message):
    __slots__ = ("sampling", "eos_token_ids", "template_tokens")
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    sampling: SamplingDefaults
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    template_tokens: _containers.RepeatedCompositeFieldContainer[TemplateToken]
    def __init__(self, sampling: _Optional[_Union[SamplingDefaults, _Mapping]] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., template_tokens: _Optional[_Iterable[_Union[TemplateToken, _Mapping]]] = ...) -> None: ...

class ModelContract(_message.Message):
    __slots__ = ("version", "vocabulary", "input_vocabulary", "vision", "cache", "graphs", "frontend", "state_views", "host_tables")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCABULARY_FIELD_NUMBER: _ClassVar[int]
    INPUT_VOCABULARY_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    FRONTEND_FIELD_NUMBER: _ClassVar[int]
    STATE_VIEWS_FIELD_NUMBER: _ClassVar[int]
    HOST_TABLES_FIELD_NUMBER: _ClassVar[int]
    version: int
    vocabulary: VocabularyContract
    input_vocabulary: InputVocabularyContract
    vision: VisionContract
    cache: CacheContract
    graphs: _containers.RepeatedCompositeFieldContainer[GraphContract]
    frontend: FrontendContract
    state_views: _containers.RepeatedCompositeFieldContainer[StateView]
    host_tables: _containers.RepeatedCompositeFieldContainer[HostStagingTable]
    def __init__(self, version: _Optional[int] = ..., vocabulary: _Optional[_Union[VocabularyContract, _Mapping]] = ..., input_vocabulary: _Optional[_Union[InputVocabularyContract, _Mapping]] = ..., vision: _Optional[_Union[VisionContract, _Mapping]] = ..., cache: _Optional[_Union[CacheContract, _Mapping]] = ..., graphs: _Optional[_Iterable[_Union[GraphContract, _Mapping]]] = ..., frontend: _Optional[_Union[FrontendContract, _Mapping]] = ..., state_views: _Optional[_Iterable[_Union[StateView, _Mapping]]] = ..., host_tables: _Optional[_Iterable[_Union[HostStagingTable, _Mapping]]] = ...) -> None: ...

class HostStagingTable(_message.Message):
    __slots__ = ("name", "table", "ngram_tokens", "heads", "multipliers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    NGRAM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    table: str
    ngram_tokens: int
    heads: int
    multipliers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., table: _Optional[str] = ..., ngram_tokens: _Optional[int] = ..., heads: _Optional[int] = ..., multipliers: _Optional[_Iterable[int]] = ...) -> None: ...

class TokenRange(_message.Message):
    __slots__ = ("begin", "end")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    begin: int
    end: int
    def __init__(self, begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class VocabularyContract(_message.Message):
    __slots__ = ("sampled", "histogram_bins", "mask_words", "excluded_ids")
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_BINS_FIELD_NUMBER: _ClassVar[int]
    MASK_WORDS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_IDS_FIELD_NUMBER: _ClassVar[int]
    sampled: TokenRange
    histogram_bins: int
    mask_words: int
    excluded_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sampled: _Optional[_Union[TokenRange, _Mapping]] = ..., histogram_bins: _Optional[int] = ..., mask_words: _Optional[int] = ..., excluded_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class InputVocabularyContract(_message.Message):
    __slots__ = ("input", "image_sentinel_ids")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SENTINEL_IDS_FIELD_NUMBER: _ClassVar[int]
    input: TokenRange
    image_sentinel_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, input: _Optional[_Union[TokenRange, _Mapping]] = ..., image_sentinel_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class VisionContract(_message.Message):
    __slots__ = ("feature_slots", "features_per_window", "patches_per_feature", "patch_capacities")
    FEATURE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_PER_WINDOW_FIELD_NUMBER: _ClassVar[int]
    PATCHES_PER_FEATURE_FIELD_NUMBER: _ClassVar[int]
    PATCH_CAPACITIES_FIELD_NUMBER: _ClassVar[int]
    feature_slots: int
    features_per_window: int
    patches_per_feature: int
    patch_capacities: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, feature_slots: _Optional[int] = ..., features_per_window: _Optional[int] = ..., patches_per_feature: _Optional[int] = ..., patch_capacities: _Optional[_Iterable[int]] = ...) -> None: ...

class CacheContract(_message.Message):
    __slots__ = ("page_tokens", "regions", "page_table_views", "cursors")
    PAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TABLE_VIEWS_FIELD_NUMBER: _ClassVar[int]
    CURSORS_FIELD_NUMBER: _ClassVar[int]
    page_tokens: int
    regions: _containers.RepeatedCompositeFieldContainer[HistoryRegion]
    page_table_views: _containers.RepeatedCompositeFieldContainer[PageTableView]
    cursors: _containers.RepeatedCompositeFieldContainer[CompletionCursor]
    def __init__(self, page_tokens: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[HistoryRegion, _Mapping]]] = ..., page_table_views: _Optional[_Iterable[_Union[PageTableView, _Mapping]]] = ..., cursors: _Optional[_Iterable[_Union[CompletionCursor, _Mapping]]] = ...) -> None: ...

class HistoryRegion(_message.Message):
    __slots__ = ("name", "kind", "planes", "tokens_per_record", "window_tokens")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PLANES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_RECORD_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: HistoryKind
    planes: _containers.RepeatedScalarFieldContainer[str]
    tokens_per_record: int
    window_tokens: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[HistoryKind, str]] = ..., planes: _Optional[_Iterable[str]] = ..., tokens_per_record: _Optional[int] = ..., window_tokens: _Optional[int] = ...) -> None: ...

class PageTableView(_message.Message):
    __slots__ = ("destination", "region", "page_offset")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    PAGE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    destination: str
    region: str
    page_offset: int
    def __init__(self, destination: _Optional[str] = ..., region: _Optional[str] = ..., page_offset: _Optional[int] = ...) -> None: ...

class CompletionCursor(_message.Message):
    __slots__ = ("name", "region", "lag_tokens")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    LAG_TOKENS_FIELD_NUMBER: _ClassVar[int]
    name: str
    region: str
    lag_tokens: int
    def __init__(self, name: _Optional[str] = ..., region: _Optional[str] = ..., lag_tokens: _Optional[int] = ...) -> None: ...

class ValueBinding(_message.Message):
    __slots__ = ("destination", "source", "indexing", "offset", "padding", "constant", "image_output", "host_table")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    INDEXING_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    CONSTANT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    HOST_TABLE_FIELD_NUMBER: _ClassVar[int]
    destination: str
    source: ValueSource
    indexing: Indexing
    offset: int
    padding: int
    constant: int
    image_output: str
    host_table: str
    def __init__(self, destination: _Optional[str] = ..., source: _Optional[_Union[ValueSource, str]] = ..., indexing: _Optional[_Union[Indexing, str]] = ..., offset: _Optional[int] = ..., padding: _Optional[int] = ..., constant: _Optional[int] = ..., image_output: _Optional[str] = ..., host_table: _Optional[str] = ...) -> None: ...

class StateView(_message.Message):
    __slots__ = ("name", "buffer", "byte_offset", "row_stride", "byte_extent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    BYTE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ROW_STRIDE_FIELD_NUMBER: _ClassVar[int]
    BYTE_EXTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    buffer: str
    byte_offset: int
    row_stride: int
    byte_extent: int
    def __init__(self, name: _Optional[str] = ..., buffer: _Optional[str] = ..., byte_offset: _Optional[int] = ..., row_stride: _Optional[int] = ..., byte_extent: _Optional[int] = ...) -> None: ...

class StateAccess(_message.Message):
    __slots__ = ("view", "mode")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    view: str
    mode: AccessMode
    def __init__(self, view: _Optional[str] = ..., mode: _Optional[_Union[AccessMode, str]] = ...) -> None: ...

class TunedBinding(_message.Message):
    __slots__ = ("buffer", "producer")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    producer: str
    def __init__(self, buffer: _Optional[str] = ..., producer: _Optional[str] = ...) -> None: ...

class GraphCapacity(_message.Message):
    __slots__ = ("batch_capacity", "token_capacity", "packed_token_capacity", "draft_tokens", "confidence_width", "lane_limit", "patch_capacity")
    BATCH_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PACKED_TOKEN_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    LANE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PATCH_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    batch_capacity: int
    token_capacity: int
    packed_token_capacity: int
    draft_tokens: int
    confidence_width: int
    lane_limit: int
    patch_capacity: int
    def __init__(self, batch_capacity: _Optional[int] = ..., token_capacity: _Optional[int] = ..., packed_token_capacity: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., confidence_width: _Optional[int] = ..., lane_limit: _Optional[int] = ..., patch_capacity: _Optional[int] = ...) -> None: ...

class GraphContract(_message.Message):
    __slots__ = ("name", "operation", "variants", "bindings", "state_accesses", "resource_dependencies", "tuned_bindings", "state_rows_per_request", "pending_token_view", "draft_cursor", "token_logprobs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    STATE_ACCESSES_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_DEPENDENCIES_FIELD_NUMBER: _ClassVar[int]
    TUNED_BINDINGS_FIELD_NUMBER: _ClassVar[int]
    STATE_ROWS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    PENDING_TOKEN_VIEW_FIELD_NUMBER: _ClassVar[int]
    DRAFT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    name: str
    operation: GraphOperation
    variants: _containers.RepeatedCompositeFieldContainer[GraphCapacity]
    bindings: _containers.RepeatedCompositeFieldContainer[ValueBinding]
    state_accesses: _containers.RepeatedCompositeFieldContainer[StateAccess]
    resource_dependencies: _containers.RepeatedScalarFieldContainer[str]
    tuned_bindings: _containers.RepeatedCompositeFieldContainer[TunedBinding]
    state_rows_per_request: int
    pending_token_view: str
    draft_cursor: str
    token_logprobs: int
    def __init__(self, name: _Optional[str] = ..., operation: _Optional[_Union[GraphOperation, str]] = ..., variants: _Optional[_Iterable[_Union[GraphCapacity, _Mapping]]] = ..., bindings: _Optional[_Iterable[_Union[ValueBinding, _Mapping]]] = ..., state_accesses: _Optional[_Iterable[_Union[StateAccess, _Mapping]]] = ..., resource_dependencies: _Optional[_Iterable[str]] = ..., tuned_bindings: _Optional[_Iterable[_Union[TunedBinding, _Mapping]]] = ..., state_rows_per_request: _Optional[int] = ..., pending_token_view: _Optional[str] = ..., draft_cursor: _Optional[str] = ..., token_logprobs: _Optional[int] = ...) -> None: ...

class ToolSyntax(_message.Message):
    __slots__ = ("opener", "closer", "tag_separator", "wrapping_newlines", "invoke_open", "invoke_close", "parameter_open", "parameter_close", "name_end", "value_open", "string_attribute", "string_true", "string_false", "block_lead", "name_key", "arguments_key", "arguments_open", "arguments_close")
    OPENER_FIELD_NUMBER: _ClassVar[int]
    CLOSER_FIELD_NUMBER: _ClassVar[int]
    TAG_SEPARATOR_FIELD_NUMBER: _ClassVar[int]
    WRAPPING_NEWLINES_FIELD_NUMBER: _ClassVar[int]
    INVOKE_OPEN_FIELD_NUMBER: _ClassVar[int]
    INVOKE_CLOSE_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_OPEN_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_CLOSE_FIELD_NUMBER: _ClassVar[int]
    NAME_END_FIELD_NUMBER: _ClassVar[int]
    VALUE_OPEN_FIELD_NUMBER: _ClassVar[int]
    STRING_ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    STRING_TRUE_FIELD_NUMBER: _ClassVar[int]
    STRING_FALSE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LEAD_FIELD_NUMBER: _ClassVar[int]
    NAME_KEY_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_KEY_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_OPEN_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_CLOSE_FIELD_NUMBER: _ClassVar[int]
    opener: str
    closer: str
    tag_separator: str
    wrapping_newlines: int
    invoke_open: str
    invoke_close: str
    parameter_open: str
    parameter_close: str
    name_end: str
    value_open: str
    string_attribute: str
    string_true: str
    string_false: str
    block_lead: str
    name_key: str
    arguments_key: str
    arguments_open: str
    arguments_close: str
    def __init__(self, opener: _Optional[str] = ..., closer: _Optional[str] = ..., tag_separator: _Optional[str] = ..., wrapping_newlines: _Optional[int] = ..., invoke_open: _Optional[str] = ..., invoke_close: _Optional[str] = ..., parameter_open: _Optional[str] = ..., parameter_close: _Optional[str] = ..., name_end: _Optional[str] = ..., value_open: _Optional[str] = ..., string_attribute: _Optional[str] = ..., string_true: _Optional[str] = ..., string_false: _Optional[str] = ..., block_lead: _Optional[str] = ..., name_key: _Optional[str] = ..., arguments_key: _Optional[str] = ..., arguments_open: _Optional[str] = ..., arguments_close: _Optional[str] = ...) -> None: ...

class ReasoningSyntax(_message.Message):
    __slots__ = ("open", "close", "open_token_id", "close_token_id", "terminal_markers", "wrapping_newlines", "after_close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    OPEN_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    CLOSE_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_MARKERS_FIELD_NUMBER: _ClassVar[int]
    WRAPPING_NEWLINES_FIELD_NUMBER: _ClassVar[int]
    AFTER_CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: str
    close: str
    open_token_id: int
    close_token_id: int
    terminal_markers: _containers.RepeatedScalarFieldContainer[str]
    wrapping_newlines: int
    after_close: str
    def __init__(self, open: _Optional[str] = ..., close: _Optional[str] = ..., open_token_id: _Optional[int] = ..., close_token_id: _Optional[int] = ..., terminal_markers: _Optional[_Iterable[str]] = ..., wrapping_newlines: _Optional[int] = ..., after_close: _Optional[str] = ...) -> None: ...

class AssistantBoundary(_message.Message):
    __slots__ = ("message_start", "message_end", "assistant_header", "recipient_prefix", "header_end", "internal_message_end", "self_recipient", "visible_recipients", "generic_tool_recipient", "named_tool_prefix", "embedded_message_ends")
    MESSAGE_START_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_END_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_HEADER_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    HEADER_END_FIELD_NUMBER: _ClassVar[int]
    INTERNAL_MESSAGE_END_FIELD_NUMBER: _ClassVar[int]
    SELF_RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_RECIPIENTS_FIELD_NUMBER: _ClassVar[int]
    GENERIC_TOOL_RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    NAMED_TOOL_PREFIX_FIELD_NUMBER: _ClassVar[int]
    EMBEDDED_MESSAGE_ENDS_FIELD_NUMBER: _ClassVar[int]
    message_start: str
    message_end: str
    assistant_header: str
    recipient_prefix: str
    header_end: str
    internal_message_end: str
    self_recipient: str
    visible_recipients: _containers.RepeatedScalarFieldContainer[str]
    generic_tool_recipient: str
    named_tool_prefix: str
    embedded_message_ends: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, message_start: _Optional[str] = ..., message_end: _Optional[str] = ..., assistant_header: _Optional[str] = ..., recipient_prefix: _Optional[str] = ..., header_end: _Optional[str] = ..., internal_message_end: _Optional[str] = ..., self_recipient: _Optional[str] = ..., visible_recipients: _Optional[_Iterable[str]] = ..., generic_tool_recipient: _Optional[str] = ..., named_tool_prefix: _Optional[str] = ..., embedded_message_ends: _Optional[_Iterable[str]] = ...) -> None: ...

class ChannelSyntax(_message.Message):
    __slots__ = ("start_control", "channel_control", "message_control", "end_control", "call_control", "return_control", "constrain_control", "role", "recipient_marker", "reasoning_channels", "content_channels", "tool_namespace", "final_channel", "tool_channel", "tool_content_type")
    START_CONTROL_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_CONTROL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_CONTROL_FIELD_NUMBER: _ClassVar[int]
    END_CONTROL_FIELD_NUMBER: _ClassVar[int]
    CALL_CONTROL_FIELD_NUMBER: _ClassVar[int]
    RETURN_CONTROL_FIELD_NUMBER: _ClassVar[int]
    CONSTRAIN_CONTROL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_MARKER_FIELD_NUMBER: _ClassVar[int]
    REASONING_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    FINAL_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    TOOL_CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    start_control: str
    channel_control: str
    message_control: str
    end_control: str
    call_control: str
    return_control: str
    constrain_control: str
    role: str
    recipient_marker: str
    reasoning_channels: _containers.RepeatedScalarFieldContainer[str]
    content_channels: _containers.RepeatedScalarFieldContainer[str]
    tool_namespace: str
    final_channel: str
    tool_channel: str
    tool_content_type: str
    def __init__(self, start_control: _Optional[str] = ..., channel_control: _Optional[str] = ..., message_control: _Optional[str] = ..., end_control: _Optional[str] = ..., call_control: _Optional[str] = ..., return_control: _Optional[str] = ..., constrain_control: _Optional[str] = ..., role: _Optional[str] = ..., recipient_marker: _Optional[str] = ..., reasoning_channels: _Optional[_Iterable[str]] = ..., content_channels: _Optional[_Iterable[str]] = ..., tool_namespace: _Optional[str] = ..., final_channel: _Optional[str] = ..., tool_channel: _Optional[str] = ..., tool_content_type: _Optional[str] = ...) -> None: ...

class PrefixBoundaryRule(_message.Message):
    __slots__ = ("role", "constraint")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    role: MessageRole
    constraint: PrefixConstraint
    def __init__(self, role: _Optional[_Union[MessageRole, str]] = ..., constraint: _Optional[_Union[PrefixConstraint, str]] = ...) -> None: ...

class ImagePreparationData(_message.Message):
    __slots__ = ("patch_size", "merge_size", "mean", "std", "min_pixels", "max_pixels")
    PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MERGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    MIN_PIXELS_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_FIELD_NUMBER: _ClassVar[int]
    patch_size: int
    merge_size: int
    mean: _containers.RepeatedScalarFieldContainer[float]
    std: _containers.RepeatedScalarFieldContainer[float]
    min_pixels: int
    max_pixels: int
    def __init__(self, patch_size: _Optional[int] = ..., merge_size: _Optional[int] = ..., mean: _Optional[_Iterable[float]] = ..., std: _Optional[_Iterable[float]] = ..., min_pixels: _Optional[int] = ..., max_pixels: _Optional[int] = ...) -> None: ...

class AtomicSpan(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ImageLayoutData(_message.Message):
    __slots__ = ("feature_ids", "atomic_spans", "outputs")
    FEATURE_IDS_FIELD_NUMBER: _ClassVar[int]
    ATOMIC_SPANS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    feature_ids: _containers.RepeatedScalarFieldContainer[int]
    atomic_spans: _containers.RepeatedCompositeFieldContainer[AtomicSpan]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, feature_ids: _Optional[_Iterable[int]] = ..., atomic_spans: _Optional[_Iterable[_Union[AtomicSpan, _Mapping]]] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class FrontendContract(_message.Message):
    __slots__ = ("tool_parser", "reasoning_parser", "image_preparation", "image_layout", "tool_syntax", "reasoning_syntax", "assistant_boundary", "prefix_boundaries", "image_preparation_data", "image_layout_data", "channel_syntax", "tool_call_id_len", "clean_up_tokenization_spaces")
    TOOL_PARSER_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PREPARATION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TOOL_SYNTAX_FIELD_NUMBER: _ClassVar[int]
    REASONING_SYNTAX_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_BOUNDARY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_BOUNDARIES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PREPARATION_DATA_FIELD_NUMBER: _ClassVar[int]
    IMAGE_LAYOUT_DATA_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_SYNTAX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_LEN_FIELD_NUMBER: _ClassVar[int]
    CLEAN_UP_TOKENIZATION_SPACES_FIELD_NUMBER: _ClassVar[int]
    tool_parser: ToolParser
    reasoning_parser: ReasoningParser
    image_preparation: ImagePreparation
    image_layout: ImageLayout
    tool_syntax: ToolSyntax
    reasoning_syntax: ReasoningSyntax
    assistant_boundary: AssistantBoundary
    prefix_boundaries: _containers.RepeatedCompositeFieldContainer[PrefixBoundaryRule]
    image_preparation_data: ImagePreparationData
    image_layout_data: ImageLayoutData
    channel_syntax: ChannelSyntax
    tool_call_id_len: int
    clean_up_tokenization_spaces: bool
    def __init__(self, tool_parser: _Optional[_Union[ToolParser, str]] = ..., reasoning_parser: _Optional[_Union[ReasoningParser, str]] = ..., image_preparation: _Optional[_Union[ImagePreparation, str]] = ..., image_layout: _Optional[_Union[ImageLayout, str]] = ..., tool_syntax: _Optional[_Union[ToolSyntax, _Mapping]] = ..., reasoning_syntax: _Optional[_Union[ReasoningSyntax, _Mapping]] = ..., assistant_boundary: _Optional[_Union[AssistantBoundary, _Mapping]] = ..., prefix_boundaries: _Optional[_Iterable[_Union[PrefixBoundaryRule, _Mapping]]] = ..., image_preparation_data: _Optional[_Union[ImagePreparationData, _Mapping]] = ..., image_layout_data: _Optional[_Union[ImageLayoutData, _Mapping]] = ..., channel_syntax: _Optional[_Union[ChannelSyntax, _Mapping]] = ..., tool_call_id_len: _Optional[int] = ..., clean_up_tokenization_spaces: _Optional[bool] = ...) -> None: ...
