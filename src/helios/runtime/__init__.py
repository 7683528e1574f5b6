"""helios.runtime"""
