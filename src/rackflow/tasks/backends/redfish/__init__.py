"""The redfish backend (`rackflow serve --backend redfish`): real BMCs over DMTF Redfish (docs/REDFISH.md).

`backend.RedfishBackend` is the backend and `config.RedfishConfig` its settings. This package module imports
nothing, so the API can check BMC endpoints (`endpoint.py`) without loading sushy.
"""
