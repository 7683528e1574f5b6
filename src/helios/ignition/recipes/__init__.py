"""helios.ignition.recipes"""
