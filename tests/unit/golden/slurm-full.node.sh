#!/bin/bash
# ddpctl: one task per node; its setup lines, then its supervisor
set -e
module load cuda/12.4
source /opt/venv/bin/activate
exec /opt/venv/bin/python /home/alice/.ddpctl/runs/train-20261123-120000-abcd/agent.py < /home/alice/.ddpctl/runs/train-20261123-120000-abcd/node.in
