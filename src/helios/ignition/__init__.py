"""helios.ignition"""
