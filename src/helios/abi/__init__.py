"""helios.abi"""
