"""The replicas behind the API: worker processes, the pipe between them, routing, fan-out and fan-in. No HTTP here.

Keep this file free of imports: it is the first thing a spawned worker process imports.
"""
