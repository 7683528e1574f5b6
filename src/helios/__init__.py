"""Helios: prepared-model LLM serving.

Stages (imports point upstream only): server -> frontend -> runtime -> core -> contract;
ignition may use contract, core and abi; runtime uses abi but never ignition.
"""

__version__ = "0.1.0"
