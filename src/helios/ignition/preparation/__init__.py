"""helios.ignition.preparation"""
