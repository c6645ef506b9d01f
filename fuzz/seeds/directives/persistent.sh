#!/bin/bash
#BB create_persistent name=py_env capacity=100GiB access=striped type=scratch
#BB destroy_persistent name=old_env
