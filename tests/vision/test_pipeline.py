"""The contract-declared image pipeline end to end: the recipe's declarations read back by the
frontend, request images through decode/prepare/layout, features cached by content hash, and greedy
tokens equal to transformers' generate on the same image bytes."""

from __future__ import annotations

import base64

import pytest
import torch

from helios.contract import serving_pb2 as spb
from helios.errors import LoadError
from helios.frontend.images.decode import ImageLimits
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import LAYOUT_OUTPUTS
from helios.frontend.images.pipeline import ImagePipeline
from helios.ignition.preparation.vision_contract import ImageProcessorSettings, declare_vision
from helios.runtime.loading.image_features import ImageFeatureCache, encode_with_cache

from .paged_greedy import encode_images, greedy
from .test_vl_equivalence import _decoded, _prompt_ids, model, recipe  # noqa: F401 (fixtures)
from .tiny_vl import IMAGE_TOKEN, MAX_PIXELS, MEAN, MIN_PIXELS, STD, VOCAB, hf_image_processor, image_bytes

CAPACITIES = (32, 256)
IMAGES = [image_bytes(90, 60, 1), image_bytes(40, 100, 2, "JPEG")]


def _url(data: bytes, media: str) -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


URLS = [_url(IMAGES[0], "image/png"), _url(IMAGES[1], "image/jpeg")]


@pytest.fixture(scope="module")
def pipeline(recipe):  # noqa: F811
    contract = spb.ModelContract()
    contract.vocabulary.sampled.end = VOCAB
    declare_vision(contract, recipe, ImageProcessorSettings(MEAN, STD, MIN_PIXELS, MAX_PIXELS), CAPACITIES, 64)
    assert list(contract.input_vocabulary.image_sentinel_ids) == [IMAGE_TOKEN]
    assert list(contract.vocabulary.excluded_ids) == [IMAGE_TOKEN]  # inside the sampled range: never sampled
    assert contract.vision.feature_slots == 64 and list(contract.frontend.image_layout_data.outputs) == [
        *LAYOUT_OUTPUTS]
    return ImagePipeline.from_contract(contract, ImageLimits(max_images=2))


def test_contract_declares_what_the_frontend_reads(pipeline):
    assert pipeline.layout.window_size == 56 and pipeline.layout.feature_id == IMAGE_TOKEN
    assert pipeline.preparation.min_pixels == MIN_PIXELS and pipeline.patch_capacities == CAPACITIES


def test_unimplemented_selectors_fail_at_load():
    contract = spb.ModelContract(vision=spb.VisionContract(features_per_window=4, patches_per_feature=4))
    contract.frontend.image_preparation = spb.IMAGE_PREPARATION_TILE_GRID
    with pytest.raises(LoadError, match="TILE_GRID"):
        ImagePipeline.from_contract(contract, ImageLimits())
    assert ImagePipeline.from_contract(spb.ModelContract(), ImageLimits()) is None


def test_capacity_and_placeholders_are_400s(pipeline):
    with pytest.raises(ImageRejected, match="2 image placeholders for 1 images"):
        pipeline.prepare(URLS[:1], _prompt_ids(2))
    small = ImagePipeline(pipeline.preparation, pipeline.layout, (16,), pipeline.limits)
    with pytest.raises(ImageRejected, match="image 1 needs 24 vision patches; at most 16 are prepared"):
        small.prepare(URLS[:1], _prompt_ids(1))


def test_requests_through_the_pipeline_equal_transformers(model, recipe, pipeline):  # noqa: F811
    cache = ImageFeatureCache(4, 256 // 4, recipe.vision.out_hidden_size)
    for count in (1, 2):
        prepared = pipeline.prepare(URLS[:count], _prompt_ids(count))
        assert prepared.patch_capacities == (32,) * count
        counts = list(prepared.feature_counts)
        assert counts == [image.num_patches // 4 for image in prepared.images]

        def encode(missing, prepared=prepared):
            return torch.cat([encode_images(recipe, prepared.tensors[i])[: counts[i]] for i in missing])

        features = encode_with_cache(cache, prepared.digests, counts, encode)
        reference = hf_image_processor()(images=[_decoded(b) for b in IMAGES[:count]], return_tensors="pt")
        input_ids = torch.tensor([prepared.prompt.token_ids])
        with torch.no_grad():
            expected = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                      pixel_values=reference["pixel_values"],
                                      image_grid_thw=reference["image_grid_thw"], max_new_tokens=16,
                                      do_sample=False)[0, input_ids.shape[1]:].tolist()
        assert greedy(recipe, prepared.prompt, features, 16) == expected
    assert (cache.stats.hits, cache.stats.misses) == (1, 2)  # the first image again in the second request: a hit


def test_frontend_layout_outputs_are_the_ones_preparation_declares():
    from helios.ignition.preparation import vision_contract

    assert vision_contract.LAYOUT_OUTPUTS == LAYOUT_OUTPUTS
