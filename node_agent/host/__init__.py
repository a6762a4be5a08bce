"""Reading and acting on this host, shared by the ops and the node runtime: /proc, the run state
files, ending a process group, interfaces, site-packages, the parsers of tools' output."""
