"""Tensor-parallel ranks: rank zero's executor (`ranks`), the peers (`rank_peers`), rendezvous,
devices, the message channel and wire format, deadlines and phase timers. Uses `records`,
`loading` and `execution`."""
