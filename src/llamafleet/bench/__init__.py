"""``llamafleet bench``: the HTTP load generator, its streaming client and reports, and the in-process engine bench."""
