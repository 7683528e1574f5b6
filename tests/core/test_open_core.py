"""open_core: every carrier reads back; trust and authorization decide before anything else."""

from __future__ import annotations

import io

import pytest

from helios.contract import PreparedContract, core_pb2, serving_pb2
from helios.core.catalogs import RebuildInput, RebuildManifest, TensorView, WeightCatalog
from helios.core.errors import (
    KeyScopeError,
    MalformedCoreError,
    MissingAeadKeyError,
    NamespaceMismatchError,
    UnknownResourceError,
    UntrustedSignerError,
)
from helios.core.keys import PublicKey
from helios.core.reader import open_core
from helios.core.records import CoreFormat, ResourceKind
from helios.errors import AuthorizationError, ContractError, SignatureError

from .builders import (
    AES_KEY,
    NAMESPACE,
    build_core,
    craft_core,
    example_contract,
    new_writer,
    random_bytes,
    read_body,
    write_body,
)


@pytest.mark.parametrize("core_format", list(CoreFormat))
@pytest.mark.parametrize("split", [None, 1, 6000])
def test_every_carrier_reads_back(tmp_path, key, core_format, split):
    blobs = {"blob.empty": b"", "blob.text": b"hello " * 1000, "blob.random": random_bytes(5000)}
    path = tmp_path / "m.core"
    written = build_core(path, [key], core_format=core_format, extra=blobs, split_nbytes=split)
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public], aes_key=AES_KEY)
    assert core.core_format is core_format
    assert core.prepared == PreparedContract.decode(*example_contract())
    assert core.resources == written.resources
    for resource_id, data in blobs.items():
        assert core.read_resource(resource_id) == data
        info = core.resource(resource_id)
        assert (info.kind, info.rank, info.decoded_nbytes) == (ResourceKind.TOKENIZER, None, len(data))
        with core.open_resource(resource_id) as stream:
            assert b"".join(iter(lambda: stream.read(333), b"")) == data
    assert core.verify_resources() == sum(r.decoded_nbytes for r in core.resources)
    assert core.publisher.license == "test-license"
    assert written.files[0] == path
    if split is None:
        assert len(written.files) == 1
    else:
        assert 1 < len(written.files) <= 1 + len(core.resources)
        assert all(f.name.startswith("m.core.part") for f in written.files[1:])


def test_sources_may_be_streams_and_paths(tmp_path, key):
    source = tmp_path / "source.bin"
    source.write_bytes(random_bytes(10_000, 3))
    writer = new_writer([key], extra={"from.path": source, "from.stream": io.BytesIO(b"abc")})
    writer.write(tmp_path / "m.core")
    core = open_core(tmp_path / "m.core", accept=NAMESPACE, trusted_keys=[key.public])
    assert core.read_resource("from.path") == source.read_bytes()
    assert core.read_resource("from.stream") == b"abc"
    with pytest.raises(UnknownResourceError):
        core.read_resource("missing")


def test_v4_resources_need_the_operator_key(tmp_path, key):
    path = tmp_path / "v4.core"
    build_core(path, [key], core_format=CoreFormat.LOGICAL_V4, extra={"blob": b"secret"})
    core = open_core(path, accept=NAMESPACE, trusted_keys=[key.public])  # contract readable
    assert core.prepared == PreparedContract.decode(*example_contract())
    with pytest.raises(MissingAeadKeyError):
        core.read_resource("blob")


@pytest.mark.parametrize("acceptance", ["", NAMESPACE.upper(), NAMESPACE + " ", " " + NAMESPACE,
                                        NAMESPACE[:-1], NAMESPACE + "/sub", "test.helios"])
def test_acceptance_must_equal_the_namespace_exactly(small_core, key, acceptance):
    with pytest.raises(NamespaceMismatchError):
        open_core(small_core, accept=acceptance, trusted_keys=[key.public])


def test_trust_decisions(tmp_path, small_core, key, other_key):
    with pytest.raises(UntrustedSignerError):
        open_core(small_core, accept=NAMESPACE, trusted_keys=[other_key.public])
    with pytest.raises(UntrustedSignerError):
        open_core(small_core, accept=NAMESPACE, trusted_keys=[])
    elsewhere = PublicKey(key.public.raw, frozenset({"someone/else"}))
    with pytest.raises(KeyScopeError):
        open_core(small_core, accept=NAMESPACE, trusted_keys=[elsewhere])
    scoped = PublicKey(key.public.raw, frozenset({NAMESPACE}))
    core = open_core(small_core, accept=NAMESPACE, trusted_keys=[scoped, other_key.public])
    assert [k.raw for k in core.admitted_signers] == [key.public.raw]


def test_one_trusted_signer_among_several_suffices(tmp_path, key, other_key):
    path = tmp_path / "co.core"
    build_core(path, [key, other_key])
    core = open_core(path, accept=NAMESPACE, trusted_keys=[other_key.public])
    assert [k.raw for k in core.admitted_signers] == [other_key.public.raw]


def resign_payload(path, key, mutate):
    """Rewrites the signed payload with `mutate` applied and re-signs it with `key`."""
    from helios.core.envelope import seal

    _, body = read_body(path)
    payload = core_pb2.DeploymentBody.FromString(body.envelope.payload)
    mutate(payload)
    encoded = payload.SerializeToString(deterministic=True)
    body.envelope.CopyFrom(seal(2, encoded, [key]))
    write_body(path, body)


def test_trust_is_decided_before_the_payload_is_parsed(small_core, key, other_key):
    from helios.core.envelope import seal

    _, body = read_body(small_core)
    body.envelope.CopyFrom(seal(2, b"\xff\xff not a protobuf", [key]))
    write_body(small_core, body)
    with pytest.raises(UntrustedSignerError):
        open_core(small_core, accept=NAMESPACE, trusted_keys=[other_key.public])
    with pytest.raises(MalformedCoreError):
        open_core(small_core, accept=NAMESPACE, trusted_keys=[key.public])


def test_authorization_comes_before_the_contract_is_interpreted(small_core, key):
    def break_contract(payload):
        payload.contract.model.version = 99

    resign_payload(small_core, key, break_contract)
    with pytest.raises(NamespaceMismatchError):
        open_core(small_core, accept="someone/else", trusted_keys=[key.public])
    with pytest.raises(ContractError):
        open_core(small_core, accept=NAMESPACE, trusted_keys=[key.public])


def test_error_families_set_exit_codes(small_core, key, other_key):
    with pytest.raises(SignatureError) as untrusted:
        open_core(small_core, accept=NAMESPACE, trusted_keys=[other_key.public])
    with pytest.raises(AuthorizationError) as unaccepted:
        open_core(small_core, accept="x", trusted_keys=[key.public])
    assert (untrusted.value.exit_code, unaccepted.value.exit_code) == (6, 7)


def test_catalogs_and_rebuild_manifest(tmp_path, key):
    writer = new_writer([key])
    rebuild = RebuildManifest("llama", "helios test", (RebuildInput("config.json", 10, b"\x01" * 32),))
    catalog = WeightCatalog(0, "weights/rank0/embed", (TensorView("embed", 3, (4, 8), 0, 64),))
    writer.set_rebuild_manifest(rebuild)
    writer.add_weight_catalog(catalog)
    writer.add_weight_catalog(WeightCatalog(0, "weights/rank0/embed", (), version=7))
    writer.write(tmp_path / "c.core")
    core = open_core(tmp_path / "c.core", accept=NAMESPACE, trusted_keys=[key.public])
    assert core.rebuild == rebuild
    assert core.weight_catalogs == (catalog,)


def test_unknown_catalog_versions_leave_the_serving_contract_unchanged(tmp_path, key):
    plain = tmp_path / "plain.core"
    build_core(plain, [key])
    future = tmp_path / "future.core"
    writer = new_writer([key])
    writer.add_weight_catalog(WeightCatalog(0, "weights/rank0/embed", (), version=99))
    writer.set_rebuild_manifest(RebuildManifest("r", "p", (), version=99))
    writer.write(future)
    a = open_core(plain, accept=NAMESPACE, trusted_keys=[key.public])
    b = open_core(future, accept=NAMESPACE, trusted_keys=[key.public])
    assert a.prepared == b.prepared
    assert (b.rebuild, b.weight_catalogs) == (None, ())


def test_writer_refuses_dangling_manifest_references_and_invalid_contracts(tmp_path, key):
    from helios.core.writer import CoreWriter

    writer = CoreWriter()
    writer.set_contract(*example_contract())
    writer.set_publisher(NAMESPACE)
    writer.add_signing_key(key)
    with pytest.raises(ContractError):
        writer.write(tmp_path / "x.core")
    assert not (tmp_path / "x.core").exists()
    contract = serving_pb2.ServingContract.FromString(example_contract()[0])
    contract.model.version = 99
    with pytest.raises(ContractError):
        writer.set_contract(contract.SerializeToString(), example_contract()[1])


def test_signed_dangling_reference_fails_at_open(tmp_path, key):
    path = craft_core(tmp_path / "d.core", [key], {}, omit={"weights/rank0/embed"})
    with pytest.raises(ContractError) as caught:
        open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
    assert caught.value.path.startswith("manifest.buffers[")


@pytest.mark.parametrize("version", [0, 1, 2, 3, 5, 7])
def test_unknown_protected_index_versions_are_rejected(tmp_path, key, version):
    from helios.core.envelope import seal
    from helios.core.errors import UnknownFormatError

    path = tmp_path / "v6.core"
    build_core(path, [key], core_format=CoreFormat.LOGICAL_V6)
    _, body = read_body(path)
    index = core_pb2.ModelIndex.FromString(body.envelope.payload)
    index.index.version = version
    body.envelope.CopyFrom(seal(1, index.SerializeToString(deterministic=True), [key]))
    write_body(path, body)
    with pytest.raises(UnknownFormatError):
        open_core(path, accept=NAMESPACE, trusted_keys=[key.public])
