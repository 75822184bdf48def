"""``llamafleet check-env``: gather facts about the machine once, judge them with pure checks, report."""
