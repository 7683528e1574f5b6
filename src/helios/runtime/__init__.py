"""helios.runtime: the engine (`engine`), its assembly from a loaded core (`service`) and offline
generation (`offline`) on top of the rooms `records`, `cache`, `scheduling`, `loading`,
`execution` and `parallel` (README, Layout)."""
