"""Where a run's time went: its lifecycle events (events.py, runs/<id>/events.jsonl), the account
computed from them alone (compute.py), and the account in words (text.py). Pure, but for the one
file the events are appended to."""
