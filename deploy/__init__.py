"""Running many replicas with existing components: the HAProxy configuration (haproxy.py) and a local
cluster of real processes for development and tests (cluster.py, `duplex cluster`)."""
