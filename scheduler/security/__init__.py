"""The scheduler's security primitives and policies: RBAC roles (rbac), JWT verification
(jwt_verify) and the sealing of sensitive values (sealing: AES-256-GCM under wrapped data keys).

The ground floor of the scheduler: it imports nothing else of it, so the store, the config and
the API can all stand on it. Authentication itself (who is calling, with which key) lives in
api/auth.py, over the key repository in store/auth.py.
"""
