"""helios.frontend"""
