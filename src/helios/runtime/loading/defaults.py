"""Load options' defaults that the command line's help states, in a module that imports no torch:
`helios serve --help` and the start of `helios serve` read them before any of the runtime is imported.
"""

DEFAULT_MEMORY_FRACTION = 0.85  # share of the memory free after loading that cache pages may take
DEFAULT_CACHED_IMAGES = 16  # encoded images a vision-language core keeps on the device (`image_features`)
DEFAULT_CACHE_BYTES = 1 << 30  # the default image count is cut so the slab stays within this
