"""helios.contract"""
