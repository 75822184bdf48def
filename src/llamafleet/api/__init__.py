"""The API process's HTTP side: routes, wire shapes, admission, middleware. The only package that imports FastAPI."""
