"""The wire the node agent shares with the control plane: the protocol (one request in, events and
a result out), every reply and request declared once, and the on-host layout (state directories,
marker files) that the control plane reads too."""
