"""Tenants: API keys with names, scopes, allowed models, a priority class and limits (keys.py), the limits enforced
at admission (limits.py), and each key's usage (usage.py). The API process's middleware and service use it; the
engine sees only a priority and a tenant name on each request."""
