"""The Docker backend: sandboxes as hardened containers on a Docker Engine. The only place
that imports the Docker SDK (``docker``): the engine edge (:mod:`.engine`), the image build
(:mod:`.images`), one sandbox (:mod:`.sandbox`), owner leases (:mod:`.owners`) and the
gVisor seccomp profile (:mod:`.seccomp`)."""
