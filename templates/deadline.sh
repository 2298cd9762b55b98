#!/bin/sh
# cloudtrain: this machine's deadline, given in its launch request (EC2 user data, Azure custom
# data), run once by cloud-init at first boot. It ends the machine DEADLINE_S seconds after boot
# even if the cloudtrain that launched it died before it could install the on-node watchdog: no VM
# without a deadline from its first second. The OS shutdown becomes the cloud's stop or delete
# (the instance's shutdown behaviour). The watchdog, once installed, enforces the same limit and
# also across stop/start; this is the backstop for the first boot.
CLOUDTRAIN_DEADLINE_S=__DEADLINE_S__
if command -v systemd-run >/dev/null 2>&1; then
    # A transient timer: seconds precision, and it survives cloud-init finishing.
    systemd-run --unit=cloudtrain-deadline --on-active="${CLOUDTRAIN_DEADLINE_S}s" /sbin/shutdown -h now && exit 0
fi
# Without systemd: shutdown's own timer, in whole minutes (rounded up: never earlier than asked).
shutdown -h +$(( (CLOUDTRAIN_DEADLINE_S + 59) / 60 ))
