"""The simulated chip's registers: state with reset values, as libedgetpu's source expects.

Registers are a model of the Beagle chip (the Edge TPU of the USB Accelerator) as
google-coral/libedgetpu's driver reads and writes them, not a replay of a trace:

* **reset values** are those of the CSR helpers' default constructors
  (``driver/config/beagle_csr_helper.h``, ``common_csr_helper.h``): scu_ctrl_3
  0x80050410, omc0_d4 0x1, rambist_ctrl_1 0x0070007F, scu_ctr_7 0x000C003F.
  Two have no published reset value and are chosen so that libedgetpu's
  read-modify-write gives the values the recorded open trace shows it writing:
  scu_ctrl_0 0x000F0959 (libedgetpu clears both inactive PHY modes and writes
  0x000F0059) and scu_ctrl_2 0x00190000 (no GCB clock gating; enabling hardware
  gating writes 0x00150000).  Everything else starts at 0.
* **the power state machine** behind scu_ctrl_3 (bits 8-9 cur_pwr_state,
  22-23 rg_force_sleep, ``beagle_top_level_handler.cc``): writing force_sleep
  0b11 puts the chip to sleep (cur_pwr_state 2) with the GCB (the 0x4xxxx
  registers: scalar core, tiles, HIB, interrupts) in reset; any other value wakes
  it (cur_pwr_state 0).  The new state shows from the ``SETTLE_READS + 1``-th
  read of scu_ctrl_3 after the write, so a driver has to poll, as libedgetpu
  does.  Status bits 0-11 are the chip's: while asleep 0x25C (power state 2, GCB
  in reset and clock-gated, SRAM shut down), so libedgetpu's std QuitReset
  writes 0x5085025C, the value of the recorded trace; at power-on 0x410.
* **the GCB in reset** (at power-on and while asleep): its registers hold their
  reset values (0: the run controls, tileconfig0 ...), host writes to them are
  dropped and reads answer 0, as libedgetpu's EnableReset warns ("HIB CSR
  accesses will not be valid").  Entering sleep resets them; ``on_gcb_reset``
  is called (the stick forgets what was loaded on the chip).
* **tileconfig0** (0x48788): a written value shows from the second read after
  the write; libedgetpu polls it because "hardware does not guarantee correct
  ordering with previous write".
* **interrupt status** registers (fatal_err_int_status, the top-level ones) clear
  the bits written as 0 (libedgetpu's ``ClearInterruptStatus`` writes all ones
  but the bit to clear).  ``gcbb_credit0`` (libedgetpu pulses 0xF then 0 to clear
  the bulk credits) is stored as written: no public source says what the credits
  gate, so nothing here depends on them.

Not thread-safe by itself: the stick holds its lock around it.
"""

from __future__ import annotations

from coralrt._usb import constants as C

__all__ = ["ChipRegisters", "RESET_VALUES", "SETTLE_READS"]

#: Reads of scu_ctrl_3 / tileconfig0 after a write that still show the old state.
SETTLE_READS = 1

RESET_VALUES = {
    C.SCU_CTRL_0: 0x000F0959,
    C.SCU_CTRL_2: 0x00190000,
    C.SCU_CTRL_3: 0x80050410,
    C.SCU_CTR_7: 0x000C003F,
    C.OMC0_D4: 0x00000001,
    C.RAMBIST_CTRL_1: 0x0070007F,
}

_STATUS_POWER_ON = 0x410    # cur_rst_gcb, pcie_gen_info (ScuCtrl3 reset value)
_STATUS_SLEEP = 0x25C       # cur_pwr_state 2, cur_gcb_sram_sd, cur_rst_gcb, cur_gated_gcb
_STATUS_RUN = 0x004         # cur_pwr_state 0

_CLEAR_ON_ZERO = (C.FATAL_ERR_INT_STATUS,) + C.TOP_LEVEL_INT_STATUSES
_LAGGING = (C.TILECONFIG0,)


def is_gcb(register: int) -> bool:
    """The GCB's registers (0x40000-0x4ffff), reset with it."""
    return register >> 16 == 4


class ChipRegisters:
    """Register values by offset, with the behaviours described in the module docstring."""

    def __init__(self, on_gcb_reset=lambda: None):
        self.on_gcb_reset = on_gcb_reset
        self.power_on()

    def power_on(self) -> None:
        """Back to the power-on state (a port reset or a replug)."""
        self.values: dict[int, int] = dict(RESET_VALUES)
        self.state = "power-on"          # "power-on" | "sleep" | "run"
        self._status = _STATUS_POWER_ON
        self._pending: dict[int, tuple[int, int]] = {}   # register -> (reads left, value)

    @property
    def gcb_in_reset(self) -> bool:
        return self.state != "run"

    # -- host access ---------------------------------------------------------------------

    def read(self, register: int) -> int:
        """What a host read answers (and the settling it advances)."""
        pending = self._pending.get(register)
        if pending is not None:
            left, value = pending
            if left > 0:
                self._pending[register] = (left - 1, value)
            else:
                del self._pending[register]
                self._commit(register, value)
        return self.peek(register)

    def write(self, register: int, value: int) -> str | None:
        """Store a host write; the reason when the chip drops it, else None."""
        if register == C.SCU_CTRL_3:
            self.values[register] = value & ~C.field_mask(C.SCU3_STATUS_BITS)
            asleep = C.field(value, C.SCU3_FORCE_SLEEP) == C.FORCE_SLEEP_ON
            self._pending[register] = (SETTLE_READS, "sleep" if asleep else "run")
            return None
        if is_gcb(register) and self.gcb_in_reset:
            return "the GCB is in reset (scu_ctrl_3 rg_force_sleep, or not woken since power-on)"
        if register in _CLEAR_ON_ZERO:
            self.values[register] = self.values.get(register, 0) & value
        elif register in _LAGGING:
            self._pending[register] = (SETTLE_READS, value)
        else:
            self.values[register] = value
        return None

    def peek(self, register: int) -> int:
        """The value as stored, without the effects of a host read."""
        if register == C.SCU_CTRL_3:
            return self._scu_ctrl_3()
        if is_gcb(register) and self.gcb_in_reset:
            return 0
        return self.values.get(register, 0)

    # -- the chip's own doing ------------------------------------------------------------

    def set_by_chip(self, register: int, bits: int) -> None:
        """Set status bits as the chip does (a fatal error), whatever the host may write."""
        self.values[register] = self.values.get(register, 0) | bits

    def interrupts_enabled(self, control: int) -> bool:
        return not self.gcb_in_reset and bool(self.values.get(control, 0) & 1)

    def _scu_ctrl_3(self) -> int:
        return self.values.get(C.SCU_CTRL_3, 0) | self._status

    def _commit(self, register: int, value) -> None:
        if register != C.SCU_CTRL_3:
            if not (is_gcb(register) and self.gcb_in_reset):
                self.values[register] = value
            return
        if value == self.state:
            return
        if value == "sleep":
            self.state, self._status = "sleep", _STATUS_SLEEP
            self._reset_gcb()
        else:
            self.state, self._status = "run", _STATUS_RUN

    def _reset_gcb(self) -> None:
        for register in [r for r in self.values if is_gcb(r)]:
            del self.values[register]
        for register in [r for r in self._pending if is_gcb(r)]:
            del self._pending[register]
        self.on_gcb_reset()
