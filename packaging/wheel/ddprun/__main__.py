"""python -m ddprun ARGS...: runs the ddprun program installed with this package, with ARGS."""
from ddprun import main

if __name__ == "__main__":
    main()
