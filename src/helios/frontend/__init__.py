"""helios.frontend: request preparation for one served model (`session`) on top of the rooms
`decoding`, `preparation`, `parsers`, `structured`, `responses` and `images` (README, Layout)."""
