"""The runtime simulator: a faithful node-local Runtime for tests, development and the demo."""

from lj_runtimekit_testkit.simulator.inventory import Binding, Device, Inventory, InventoryError
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory, parse_inventory
from lj_runtimekit_testkit.simulator.ledger import Allocation
from lj_runtimekit_testkit.simulator.simulator import Simulator

__all__ = [
    "Allocation",
    "Binding",
    "Device",
    "Inventory",
    "InventoryError",
    "Simulator",
    "load_inventory",
    "parse_inventory",
]
