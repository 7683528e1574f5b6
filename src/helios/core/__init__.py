"""helios.core"""
