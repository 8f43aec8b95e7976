"""Numbers of the Coral USB Accelerator's USB interface.

Sources (see docs/usb.md and the Edge TPU stack reference, §1): libedgetpu's
``driver/usb`` (IDs, endpoints, descriptor tags, control requests, timeouts),
the DFU 1.1 specification (class requests, states, status codes) and the
register offsets of ``beagle_csr_offsets.h``.
"""

from __future__ import annotations

import struct

# -- identities -----------------------------------------------------------------------------
BOOTLOADER_ID = (0x1A6E, 0x089A)   # Global Unichip: DFU mode after power-up
APP_ID = (0x18D1, 0x9302)          # Google: firmware running
ML_INTERFACE = 0

# -- endpoints (single-endpoint mode) -------------------------------------------------------
EP_OUT = 0x01         # every host -> device stream, each preceded by an 8-byte header
EP_OUTPUT = 0x81      # output activations
EP_EVENT = 0x82       # 16-byte event records
EP_INTERRUPT = 0x83   # 4-byte interrupt words

# -- descriptor tags ------------------------------------------------------------------------
TAG_INSTRUCTIONS = 0
TAG_INPUT = 1
TAG_PARAMETERS = 2
TAG_OUTPUT = 3
TAG_INTERRUPT0 = 4
TAG_ERROR = 0xF       # coralrt wire protocol: the device does not know the segment
TAG_NAMES = {0: "instructions", 1: "input", 2: "parameters", 3: "output", 4: "interrupt0",
             5: "interrupt1", 6: "interrupt2", 7: "interrupt3", 0xF: "error"}

HEADER = struct.Struct("<II")          # payload length, tag & 0xF (bytes 5..7 zero)
EVENT = struct.Struct("<QIB3x")        # address, length, tag & 0xF
# coralrt wire protocol (docs/usb.md): the tag 0 record that runs a loaded segment
RUN_MAGIC = b"CRTSRUN\0"
RUN_RECORD = struct.Struct("<8sII")    # magic, CRC-32 of the segment header, input count
EVENT_SIZE = 16
INTERRUPT_SIZE = 4
FATAL_INTERRUPT_BIT = 0x1

# -- transfer sizes -------------------------------------------------------------------------
MAX_BULK_OUT = 1 << 20                 # libedgetpu's max_bulk_out_transfer_size
BULK_IN_CHUNK = {"usb3": 1024, "usb2": 256}      # device outfeed chunk per link speed
OUTFEED_CHUNK_LENGTH = {"usb3": 0x80, "usb2": 0x20}  # register value, unit 8 bytes
MAX_BULK_IN = 1 << 20                  # largest single read asked of pyusb

# -- timeouts -------------------------------------------------------------------------------
DEFAULT_TIMEOUT = 6.0                  # seconds; libedgetpu's usb_timeout_millis
OPEN_RETRIES = 3                       # attempts to open/claim before giving up
RETRY_DELAY = 0.2                      # seconds between open attempts
REENUMERATION_TIMEOUT = 10.0           # seconds to wait for 18d1:9302 after DFU
# An enumerated stick is not necessarily ready (public reports: libedgetpu sleeps 1 s
# before each of up to 25 open attempts "to reduce chances of transfer errors"): the
# first register read of the bring-up is retried for at most READY_TIMEOUT seconds,
# each attempt waiting at most READY_PROBE_TIMEOUT.  The same short read tells a
# wedged stick (answers nothing) from one whose bulk transfer alone timed out.
READY_TIMEOUT = 3.0
READY_PROBE_TIMEOUT = 0.5
DFU_ATTEMPTS = 3                       # firmware downloads tried before giving up
DFU_RECOVERY_READS = 8                 # GETSTATUS reads while bringing the bootloader
                                       # back to dfuIDLE before a download
DFU_RECOVERY_RESETS = 2                # port resets among them

# -- register access (control transfers) ----------------------------------------------------
REQ_TYPE_WRITE = 0x40                  # vendor, device, OUT
REQ_TYPE_READ = 0xC0                   # vendor, device, IN
REQ_REG64 = 0
REQ_REG32 = 1

# -- DFU 1.1 --------------------------------------------------------------------------------
DFU_OUT = 0x21                         # class, interface, OUT
DFU_IN = 0xA1                          # class, interface, IN
DFU_DETACH, DFU_DNLOAD, DFU_UPLOAD, DFU_GETSTATUS, DFU_CLRSTATUS, DFU_GETSTATE, DFU_ABORT = range(7)
DFU_BLOCK_SIZE = 0x100
DFU_STATES = ("appIDLE", "appDETACH", "dfuIDLE", "dfuDNLOAD-SYNC", "dfuDNBUSY",
              "dfuDNLOAD-IDLE", "dfuMANIFEST-SYNC", "dfuMANIFEST", "dfuMANIFEST-WAIT-RESET",
              "dfuUPLOAD-IDLE", "dfuERROR")
DFU_STATE_IDLE = 2
DFU_STATE_DNLOAD_SYNC = 3
DFU_STATE_DNBUSY = 4
DFU_STATE_DNLOAD_IDLE = 5
DFU_STATE_MANIFEST_SYNC = 6
DFU_STATE_MANIFEST = 7
DFU_STATE_MANIFEST_WAIT_RESET = 8
DFU_STATE_UPLOAD_IDLE = 9
DFU_STATE_ERROR = 10
DFU_STATUS_NAMES = ("OK", "errTARGET", "errFILE", "errWRITE", "errERASE", "errCHECK_ERASED",
                    "errPROG", "errVERIFY", "errADDRESS", "errNOTDONE", "errFIRMWARE",
                    "errVENDOR", "errUSBR", "errPOR", "errUNKNOWN", "errSTALLEDPKT")
DFU_STATUS_OK = 0
DFU_STATUS_ERR_ADDRESS = 8
DFU_STATUS_ERR_FIRMWARE = 10
DFU_STATUS_ERR_STALLEDPKT = 15
DFU_STATUS = struct.Struct("<B3sBB")   # GETSTATUS: bStatus, bwPollTimeout (24 bit), bState, iString

# -- registers (Beagle CSR offsets) ---------------------------------------------------------
SCU_CTRL_0 = 0x1A30C
SCU_CTRL_2 = 0x1A314
SCU_CTRL_3 = 0x1A318
SCU_CTR_7 = 0x1A33C
OMC0_00 = 0x1A000
OMC0_D4 = 0x1A0D4
OMC0_D8 = 0x1A0D8
RAMBIST_CTRL_1 = 0x1A704
SLV_ABM_EN = 0x1A500
MST_ABM_EN = 0x1A600
SLV_ERR_RESP_ISR_MASK = 0x1A558
MST_ERR_RESP_ISR_MASK = 0x1A658
GCBB_CREDIT0 = 0x1907C
SCALAR_CORE_RUN_CONTROL = 0x44018
AV_DATA_POP_RUN_CONTROL = 0x44158
PARAMETER_POP_RUN_CONTROL = 0x44198
INFEED_RUN_CONTROL = 0x441D8
OUTFEED_RUN_CONTROL = 0x44218
IDLE_REGISTER = 0x4A000
TILECONFIG0 = 0x48788
DEEP_SLEEP = 0x40020
OP_RUN_CONTROL = 0x400C0
NARROW_TO_WIDE_RUN_CONTROL = 0x40150
WIDE_TO_NARROW_RUN_CONTROL = 0x40110
MESH_BUS_RUN_CONTROLS = (0x40250, 0x40298, 0x402E0, 0x40328)
RING_BUS_RUN_CONTROLS = (0x40190, 0x401D0, 0x40210)   # consumer 0, consumer 1, producer
DESCR_EP = 0x4C148
MULTI_BO_EP = 0x4C160
OUTFEED_CHUNK_LENGTH_REG = 0x4C058
FATAL_ERR_INT_CONTROL = 0x4C060
FATAL_ERR_INT_STATUS = 0x4C068
TOP_LEVEL_INT_CONTROLS = (0x4C070, 0x4C080, 0x4C090, 0x4C0A0)
HIB_ERROR_STATUS = 0x486F0
HIB_FIRST_ERROR_STATUS = 0x48700

FATAL_ERR_INT_CONTROL_ALL = 0x1       # one fatal interrupt (InterruptController: (1<<n)-1)
TOP_LEVEL_INT_STATUSES = (0x4C078, 0x4C088, 0x4C098, 0x4C0A8)
TOP_LEVEL_INT_CONTROL = 0x486B0

RUN_CONTROL_IDLE, RUN_CONTROL_RUN, RUN_CONTROL_HALT = 0, 1, 2

# -- register fields (beagle_csr_helper.h, common_csr_helper.h) ------------------------------
# Each is (shift, width).  scu_ctrl_0: the inactive PHY modes the open clears.
SCU0_PCIE_INACT_PHY_MODE = (8, 3)
SCU0_USB_INACT_PHY_MODE = (11, 3)
# scu_ctrl_2: rg_gated_gcb (0 deprecated, 1 hardware clock gating, 2 no gating).
SCU2_GATED_GCB = (18, 2)
GATED_GCB_HARDWARE, GATED_GCB_NONE = 1, 2
# scu_ctrl_3: the power state machine and the clocks (ScuCtrl3).
SCU3_CUR_PWR_STATE = (8, 2)        # read-only: 0 run, 2 sleep
SCU3_FORCE_SLEEP = (22, 2)         # 3: force sleep (GCB in reset); 0b10: stay awake
SCU3_GCB_CLKDIV = (28, 2)          # 0: 500 MHz, 1: 250, 2: 125, 3: 63
SCU3_AXI_CLK_125M = (30, 1)        # 1: 125 MHz, 0: 250 MHz
SCU3_8051_CLK_250M = (31, 1)       # 1: 250 MHz, 0: 500 MHz
SCU3_STATUS_BITS = (0, 12)         # bits the chip sets (power state, GCB reset, gating)
PWR_STATE_RUN, PWR_STATE_SLEEP = 0, 2
FORCE_SLEEP_ON, FORCE_SLEEP_OFF = 0b11, 0b10
# The clock settings libedgetpu's QuitReset writes for a USB stick, by the name of the
# libedgetpu package that uses them: "max" (libedgetpu1-max, the direct build,
# PerformanceExpectation_Max) and "std" (libedgetpu1-std, the throttled build,
# PerformanceExpectation_High).  Values: (gcb clkdiv, axi_clk_125m, 8051_clk_250m).
CLOCKS = {"max": (0, 0, 0), "std": (1, 1, 0)}
DEFAULT_CLOCK = "std"
# omc0_d4 bit 31: thermal warning enable; omc0_d8 bit 31: thermal shutdown enable.
OMC_THM_WARN_EN = (31, 1)
OMC_SD_EN = (31, 1)
# rambist_ctrl_1: MBIST interrupt status and mask; scu_ctr_7: boot failure bits and mask.
RAMBIST_INT_STATUS = (16, 3)
RAMBIST_INT_MASK = (20, 3)
SCU7_PLL_LOCK_FAILURE = (16, 1)
SCU7_USB_SEL_FAILURE = (17, 1)
SCU7_BOOT_FAILURE_MASK = (18, 2)
EFUSE_REVISION = (24, 8)           # omc0_00
IDLE_REGISTER_ENABLE_COUNTER_1 = 0x1        # IdleRegister: enabled, counter 1
TILE_CONFIG_BROADCAST = 0x7F                # TileConfig<7>: broadcast to every tile
DEEP_SLEEP_DELAYS = 0x1E02                  # DeepSleep: to_sleep 2, to_wake 30


def field(value: int, f: tuple[int, int]) -> int:
    """Bits ``f`` = (shift, width) of ``value``."""
    return (value >> f[0]) & ((1 << f[1]) - 1)


def field_mask(f: tuple[int, int]) -> int:
    """The bits of field ``f`` = (shift, width), in place."""
    return ((1 << f[1]) - 1) << f[0]


def with_field(value: int, f: tuple[int, int], bits: int) -> int:
    """``value`` with its bits ``f`` replaced by ``bits``."""
    mask = field_mask(f)
    return (value & ~mask) | ((bits << f[0]) & mask)

SCALAR_RUN_CONTROLS = (SCALAR_CORE_RUN_CONTROL, AV_DATA_POP_RUN_CONTROL,
                       PARAMETER_POP_RUN_CONTROL, INFEED_RUN_CONTROL, OUTFEED_RUN_CONTROL)
TILE_RUN_CONTROLS = ((OP_RUN_CONTROL, NARROW_TO_WIDE_RUN_CONTROL, WIDE_TO_NARROW_RUN_CONTROL)
                     + MESH_BUS_RUN_CONTROLS + RING_BUS_RUN_CONTROLS)


def register_width(offset: int) -> int:
    """4 for the 32-bit SCU/OMC/bridge registers (0x1xxxx), else 8 (the GCB CSRs)."""
    return 4 if offset >> 16 == 1 else 8
