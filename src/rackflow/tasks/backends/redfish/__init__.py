"""The redfish backend (`rackflow serve --backend redfish`): real BMCs over DMTF Redfish (docs/REDFISH.md).

`backend.RedfishBackend` is the backend and `config.RedfishConfig` its settings; what a BMC endpoint in the
inventory may be is `rackflow.inventory.bmc`. This package module imports nothing, so importing its
settings (`serve` does, to fail early) does not load sushy.
"""
