"""helios.server"""
