"""Running a step plan on a loaded model: the executor, the packer and its image, mask and history
sources, history storage, image features, prompt scores and the scheduler geometry of a loaded
model. Uses `records` and `loading`."""
