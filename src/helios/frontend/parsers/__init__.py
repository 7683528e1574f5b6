"""helios.frontend.parsers"""
