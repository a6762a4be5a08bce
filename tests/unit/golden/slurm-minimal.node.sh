#!/bin/bash
# ddpctl: one task per node; its setup lines, then its supervisor
set -e
exec python3 /home/alice/.ddpctl/runs/train-20261123-120000-abcd/agent.py < /home/alice/.ddpctl/runs/train-20261123-120000-abcd/node.in
