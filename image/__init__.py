"""Builds and runs vmevents' one image with a container engine that answers on this machine.

`python -m image build` (make image) builds the Dockerfile; where no Python base image can be pulled it
first builds one from Debian's packages (image/base.py). The image tests and the start-up bench run the
functions from it through image/run.py.
"""
