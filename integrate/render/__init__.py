"""Text for people, rendered from the JSON form of the records (what a person reads is what an agent
reads; a cached result renders too).

`terminal.py` renders every command's output for a terminal (`analyze --markdown` included);
`markdown.py` renders PLAN.md, the file a reviewer approves.
"""
